package forward

// Kind is which model server a forward proxies to.
type Kind string

// The three forwards a pairing may reach.
const (
	// KindOllama is a local ollama server (its native /api paths and its
	// OpenAI-compatible /v1 paths).
	KindOllama Kind = "ollama"
	// KindLLM is an OpenAI-compatible server (/v1 paths only).
	KindLLM Kind = "llm"
	// KindPII is a PII sterilizer: any path, model field still scoped.
	KindPII Kind = "pii"
)

// Lane returns the forward's lane name, "inference/<kind>", as grants and
// audit events spell it.
func (k Kind) Lane() string { return "inference/" + string(k) }

// EnvVar names the environment variable where the person points the
// forward at their server (OLLAMA_ADDR, BC_LLM_ADDR, BC_PII_ADDR); "" for
// an unknown kind.
func (k Kind) EnvVar() string {
	switch k {
	case KindOllama:
		return "OLLAMA_ADDR"
	case KindLLM:
		return "BC_LLM_ADDR"
	case KindPII:
		return "BC_PII_ADDR"
	}
	return ""
}

// DefaultAddr is where the forward's server listens when its EnvVar is
// unset: ollama 127.0.0.1:11434, llm 127.0.0.1:8000, pii 127.0.0.1:8010;
// "" for an unknown kind.
func (k Kind) DefaultAddr() string {
	switch k {
	case KindOllama:
		return "127.0.0.1:11434"
	case KindLLM:
		return "127.0.0.1:8000"
	case KindPII:
		return "127.0.0.1:8010"
	}
	return ""
}

// valid reports whether k is one of the three kinds.
func (k Kind) valid() bool { return k.EnvVar() != "" }
