package client

import (
	"context"
	"io"
	"net/url"
)

// LanePath and LaneProtocol are the bastion lane endpoint and its Upgrade
// token (api.LaneConnectPath, api.LaneProtocol).
const (
	LanePath     = "/api/v1/bastions/connect"
	LaneProtocol = "bc-lane-v1"
)

// ConnectLane opens lane (inference/ollama, inference/llm, inference/pii,
// service/NAME or egress/HOST:PORT) on the bastion through the control
// plane's tunnel to it. The connection carries the lane's bytes as they
// are; Close ends the lane.
func (c *Client) ConnectLane(ctx context.Context, bastionID, lane string) (io.ReadWriteCloser, error) {
	return c.upgrade(ctx, LanePath, url.Values{"bastion": {bastionID}, "lane": {lane}}, LaneProtocol, nil)
}
