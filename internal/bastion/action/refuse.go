package action

// The refusal reasons of this package. They are stable, kebab-case and
// part of the wire's contract (the "reason" of a refused op).
const (
	// ReasonBadScript: the script is empty or over MaxScriptBytes.
	ReasonBadScript = "bad-script"
	// ReasonBadEffect: no effects or over MaxEffects, or an effect that is
	// not a clean relative path (absolute, "..", a control character, a
	// ".agent" folder), a duplicate, or inside another effect.
	ReasonBadEffect = "bad-effect"
	// ReasonBadInput: over MaxInputs inputs, or an input whose URL is not
	// http(s) with a host (or carries credentials), or whose file name is
	// not a plain name, or a duplicate name.
	ReasonBadInput = "bad-input"
	// ReasonDestinationPrivate: an input's host is (or resolves to) an
	// address this machine must not reach for a program: see the package
	// comment.
	ReasonDestinationPrivate = "destination-private"
	// ReasonEffectNotFile: an effect exists but is not a regular file (a
	// link, a folder, a device), in the folder or after the run, or a
	// link in its path leads out of the folder.
	ReasonEffectNotFile = "effect-not-file"
	// ReasonEffectTooLarge: an effect is over MaxEffectBytes, in the
	// folder or after the run.
	ReasonEffectTooLarge = "effect-too-large"
	// ReasonInputTooLarge: an input's body is over MaxInputBytes.
	ReasonInputTooLarge = "input-too-large"
	// ReasonInputFetch: an input could not be fetched (no answer, a status
	// other than 200, a refused redirect).
	ReasonInputFetch = "input-fetch-failed"
	// ReasonUnknownPlan: no such plan here: never made, expired, or spent.
	ReasonUnknownPlan = "unknown-plan"
	// ReasonPlanMismatch: the digest named is not the plan's.
	ReasonPlanMismatch = "plan-mismatch"
	// ReasonStale: an effect in the folder changed since the dry run.
	ReasonStale = "stale"
)

// RefusedError is a refusal with a stable Reason and a Detail that is safe
// to show to the control plane (a path or host the op itself named, never
// a secret or an address a name resolved to). Match it with errors.As, or
// through the interface{ RefusalReason() string } other packages use.
type RefusedError struct {
	// Reason is one of the Reason constants.
	Reason string
	// Detail says what was refused, in safe words.
	Detail string
}

// Error returns the reason and the detail.
func (e *RefusedError) Error() string {
	if e.Detail == "" {
		return e.Reason
	}
	return e.Reason + ": " + e.Detail
}

// RefusalReason returns Reason.
func (e *RefusedError) RefusalReason() string { return e.Reason }

// refuse returns a *RefusedError.
func refuse(reason, detail string) error { return &RefusedError{Reason: reason, Detail: detail} }
