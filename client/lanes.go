package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
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
	q := url.Values{"bastion": {bastionID}, "lane": {lane}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+LanePath+"?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("client: lane request: %w", err)
	}
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", LaneProtocol)
	hc := *c.HTTP
	hc.Timeout = 0 // a lane lasts as long as it is used
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: lane: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var eb apitypes.ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return nil, &Error{Status: resp.StatusCode, Code: "INTERNAL_ERROR", Message: "unexpected answer " + resp.Status}
		}
		return nil, &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: eb.Error.RequestID}
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errors.New("client: the lane's connection is not writable")
	}
	return rwc, nil
}
