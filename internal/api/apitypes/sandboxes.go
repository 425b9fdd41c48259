package apitypes

// UploadBeginOut is images.beginUpload's answer: the upload's id, where
// its bytes go (PUT, see UploadState) and the largest image accepted.
type UploadBeginOut struct {
	UploadID   string `json:"upload_id"`
	UploadPath string `json:"upload_path"`
	MaxBytes   int64  `json:"max_bytes"`
}

// UploadState is the upload endpoint's answer (GET or PUT
// /api/v1/uploads/{id}): how many bytes the server holds, where the next
// write continues.
type UploadState struct {
	UploadID string `json:"upload_id"`
	Offset   int64  `json:"offset"`
	MaxBytes int64  `json:"max_bytes"`
}

// ImageImportIn is images.import's input: the upload, the image's name and
// the digest the client computed.
type ImageImportIn struct {
	UploadID string `json:"upload_id" api:"max=64"`
	Name     string `json:"name" api:"max=128"`
	Digest   string `json:"digest" api:"max=71"`
}

// SandboxCreateIn is sandboxes.create's input: a template, or a
// checkpoint of the caller's own to restore (under its own template;
// template may then be left out).
type SandboxCreateIn struct {
	TenantIn
	Template       string `json:"template" api:"max=64"`
	FromCheckpoint string `json:"from_checkpoint,omitempty" api:"max=64"`
}

// SandboxCheckpointIn is sandboxes.checkpoint's input: the sandbox, and
// whether to capture its processes' memory too (runsc only).
type SandboxCheckpointIn struct {
	ID     string `json:"id" api:"max=64"`
	Memory bool   `json:"memory,omitempty"`
}

// SandboxExtendIn is sandboxes.extend's input.
type SandboxExtendIn struct {
	ID      string `json:"id" api:"max=64"`
	Seconds int64  `json:"seconds" api:"min=60,max=604800"`
}

// ExecIn is sandboxes.exec's input: argv (no shell) and a timeout (0: the
// server's default).
type ExecIn struct {
	ID             string   `json:"id" api:"max=64"`
	Argv           []string `json:"argv" api:"items=256,max=16384"`
	TimeoutSeconds int64    `json:"timeout_seconds" api:"min=0,max=600"`
}

// SandboxPreviewIn is sandboxes.preview's input: the sandbox, the port
// inside it, and the URL's lifetime in seconds (0: an hour; at most a
// day, and never past the sandbox's deadline).
type SandboxPreviewIn struct {
	ID         string `json:"id" api:"max=64"`
	Port       int    `json:"port" api:"min=1,max=65535"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty" api:"min=0,max=86400"`
}

// PreviewKeyOut is previews.rotateKey's answer: the new key's id.
type PreviewKeyOut struct {
	KeyID string `json:"key_id"`
}
