package daemon

import (
	"strings"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Labeler is a driver that advertises capability labels of its own (the
// sandbox host's runtime.* labels).
type Labeler interface{ Labels() map[string]string }

// helloLabels are the labels bcd sends in Hello: the configured ones minus
// any under spec.LabelPrefix, which only the driver that really has the
// capability sets, so no configuration can claim a runtime bcd lacks.
func helloLabels(cfg map[string]string, d driver.Driver) map[string]string {
	out := map[string]string{}
	for k, v := range cfg {
		if !strings.HasPrefix(k, spec.LabelPrefix) {
			out[k] = v
		}
	}
	if l, ok := d.(Labeler); ok {
		for k, v := range l.Labels() {
			if strings.HasPrefix(k, spec.LabelPrefix) {
				out[k] = v
			}
		}
	}
	return out
}
