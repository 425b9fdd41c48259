package apitypes

// UploadBeginOut is images.beginUpload's answer.
type UploadBeginOut struct {
	MaxChunk int    `json:"max_chunk"`
	UploadID string `json:"upload_id"`
}

// ChunkIn is images.uploadChunk's input: one chunk of an upload at Offset.
type ChunkIn struct {
	UploadID   string `json:"upload_id" api:"max=64"`
	Offset     int64  `json:"offset" api:"min=0,max=2147483648"`
	DataBase64 string `json:"data_base64" api:"max=54620"`
}

// ChunkOut is images.uploadChunk's answer.
type ChunkOut struct {
	NextOffset int64 `json:"next_offset"`
}

// ImageImportIn is images.import's input: the upload, the image's name and
// the digest the client computed.
type ImageImportIn struct {
	UploadID string `json:"upload_id" api:"max=64"`
	Name     string `json:"name" api:"max=128"`
	Digest   string `json:"digest" api:"max=71"`
}

// SandboxCreateIn is sandboxes.create's input.
type SandboxCreateIn struct {
	TenantIn
	Template string `json:"template" api:"max=64"`
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
