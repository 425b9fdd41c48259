package api

import (
	"strings"
	"testing"
)

// TestLaneNeverNamesTheOpsPort: the public lane endpoint's lane shape
// refuses every lane that names the bastion's ops server (port 18400, an
// "ops" lane, a raw port or address): ops and terminals are reached only
// through bastions.op and the terminal endpoint. (egress/HOST:18400 is an
// egress target on the internet, carried by a parked worker, never the
// ops server; service/NAME maps to a service slot, 18100 to 18199.)
func TestLaneNeverNamesTheOpsPort(t *testing.T) {
	for _, lane := range []string{"ops", "ops/18400", "inference/ops", "18400", "port/18400", "tcp/18400", "service/ops:18400",
		"service/18400/", "inference/llm:18400", "100.100.0.2:18400", "tunnel/100.100.0.2:18400", "service/../ops", "terminal", "ops/terminal"} {
		if laneRE.MatchString(lane) {
			t.Errorf("lane %q is accepted", lane)
		}
	}
	for _, lane := range []string{"inference/llm", "service/ops", "egress/example.com:443"} {
		if !laneRE.MatchString(lane) {
			t.Errorf("lane %q is refused", lane)
		}
	}
	if strings.Contains(laneRE.String(), "18400") {
		t.Error("the lane shape names the ops port")
	}
}
