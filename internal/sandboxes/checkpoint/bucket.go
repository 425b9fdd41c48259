package checkpoint

import "gocloud.dev/blob"

// StoreOn returns a store over a bucket its caller already opened (the
// control plane's object store): the same keys, checks and limits as
// OpenStore's. The caller keeps ownership of b; do not Close the store.
func StoreOn(b *blob.Bucket) *Store { return &Store{bucket: b, lim: DefaultLimits()} }
