package share

import "strconv"

// Reasons a share op or a share's setup is refused. They are stable,
// kebab-case, and asserted exactly by tests.
const (
	// ReasonPathInvalid: a path that is absolute, holds "..", a NUL, or is
	// longer than maxPath (4096); or a move of the folder itself.
	ReasonPathInvalid = "path-invalid"
	// ReasonExcluded: the path, or where a link in it leads, matches one of
	// the share's exclude patterns.
	ReasonExcluded = "excluded"
	// ReasonAgentFolder: the path, or where a link in it leads, is in a
	// ".agent" folder.
	ReasonAgentFolder = "agent-folder"
	// ReasonLinkOutside: a link in the path is absolute or leads out of the
	// shared folder.
	ReasonLinkOutside = "link-outside"
	// ReasonLinkLoop: resolving the path follows more than 40 links.
	ReasonLinkLoop = "link-loop"
	// ReasonNotFound: the path (or the shared folder) does not exist.
	ReasonNotFound = "not-found"
	// ReasonNotAFile: a read of something that is not a regular file.
	ReasonNotAFile = "not-a-file"
	// ReasonNotADir: a listing of something that is not a folder, or a path
	// that goes through a file.
	ReasonNotADir = "not-a-dir"
	// ReasonTooLarge: a file over the read limit, or a folder with too many
	// entries to list or move.
	ReasonTooLarge = "too-large"
	// ReasonDestinationExists: a move whose destination exists (checked,
	// and enforced by the rename itself).
	ReasonDestinationExists = "destination-exists"
	// ReasonPlanInvalid: a move plan with no move, more than 100, or
	// two moves whose paths are the same or one inside the other.
	ReasonPlanInvalid = "plan-invalid"
	// ReasonPathChanged: the file opened is not the one the checks
	// resolved (it was replaced in between).
	ReasonPathChanged = "path-changed"
	// ReasonUnknownShare: no share has that id.
	ReasonUnknownShare = "unknown-share"
	// ReasonPatternInvalid: an exclude pattern that is empty, absolute,
	// holds "..", ".", an empty component or a NUL, is not a valid glob,
	// or one pattern too many (more than 64).
	ReasonPatternInvalid = "pattern-invalid"
	// ReasonHoldsDataDir: the folder to share holds the bastion's data
	// directory (its keys), or lies inside it.
	ReasonHoldsDataDir = "share-holds-data-dir"
)

// RefusedError is a refusal: Reason is one of the Reason constants,
// Detail a safe description (the path as the caller gave it, quoted; never
// where a link leads).
type RefusedError struct {
	Reason string
	Detail string
}

// Error returns the reason and the detail.
func (e *RefusedError) Error() string { return e.Reason + ": " + e.Detail }

// RefusalReason returns Reason, for callers that recognise refusals by
// interface.
func (e *RefusedError) RefusalReason() string { return e.Reason }

// refuse returns a RefusedError whose detail is what, quoted so that a
// control character in a path cannot forge a log line.
func refuse(reason, what string) error {
	return &RefusedError{Reason: reason, Detail: strconv.Quote(what)}
}
