// Package forward is the bastion's inference forwards: the gated listeners
// inside a pairing's tunnel that proxy HTTP to a model server the person
// runs on this machine (ollama, an OpenAI-compatible "llm" server, or a
// "pii" sterilizer).
//
// Each forward is fail closed:
//
//   - The upstream must be this machine. CheckUpstream resolves the
//     configured address once and requires every address to be loopback or
//     one this machine takes as its own (netguard.LocalChecker); only those
//     addresses are ever dialled, in order. No HTTP proxy from the
//     environment is used.
//   - A connection is accepted only while the pairing holds the
//     "inference" family and one of its stream slots (Streams) is free; the
//     slot is held for the connection's life. A connection with no byte
//     read or written for Config.Idle (10 minutes) is closed.
//   - Every request goes through FilterRequest: a known list of paths per
//     kind, the store paths (/api/pull, /api/push, /api/delete,
//     /api/create, /api/copy) only with the "models" family, and the model
//     a request names always in the pairing's model scope. The pii kind
//     forwards any path (a sterilizer's API is its own), but a JSON object
//     body's top-level "model" is still checked against the scope; its
//     "name" is not, since a sterilizer's input may carry a person's name.
//   - Model lists (/api/tags, /api/ps, /v1/models) are rewritten to the
//     models in scope. Every other response streams through unbuffered
//     and uncapped.
//
// Every refusal carries a stable Reason, is answered as a JSON error and is
// reported as an Event for the bastion's audit chain; every accepted
// connection is reported once.
package forward
