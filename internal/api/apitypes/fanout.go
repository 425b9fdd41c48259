package apitypes

// FanoutSummaryIn is commands.fanoutSummary's input: the fan-out whose
// commands to count.
type FanoutSummaryIn struct {
	TenantIn
	FanoutID string `json:"fanout_id" api:"max=64"`
}

// FanoutSummary is commands.fanoutSummary's answer: how many of the
// fan-out's commands the caller sees, and how many are in each state
// (states with none are left out).
type FanoutSummary struct {
	FanoutID string         `json:"fanout_id"`
	Total    int            `json:"total"`
	States   map[string]int `json:"states"`
}

// Done reports whether every command of the summary is in a final state.
func (s FanoutSummary) Done() bool {
	return s.States["succeeded"]+s.States["failed"]+s.States["cancelled"] == s.Total
}
