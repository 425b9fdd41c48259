package apitypes

// SecretPutIn is secrets.put's input.
type SecretPutIn struct {
	TenantIn
	Name        string `json:"name" api:"max=128"`
	ValueBase64 string `json:"value_base64" api:"max=65536"`
	Scope       string `json:"scope" api:"max=16"`
}

// SecretRefIn names a secret by its reference.
type SecretRefIn struct {
	Ref string `json:"ref" api:"max=256"`
}

// SecretDeleteIn is secrets.delete's input.
type SecretDeleteIn struct {
	Ref   string `json:"ref" api:"max=256"`
	Scope string `json:"scope" api:"max=16"`
}
