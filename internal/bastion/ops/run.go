package ops

import (
	"context"
	"encoding/base64"
	"fmt"
)

// MaxRead bounds a files:read answer's data.
const MaxRead = 4 << 20

// run dispatches a decided op to its handler and shapes the result as
// b19-wire.md says.
func (s *Server) run(ctx context.Context, op Op) (any, error) {
	switch a := op.Args.(type) {
	case ObserveNetArgs:
		return s.observeNet(ctx, a)
	case FilesArgs:
		return s.files(op.Kind, a)
	case MovePlanArgs:
		return s.cfg.Files.ApplyMoves(a.Share, a.Moves)
	case DryRunArgs:
		return s.cfg.Actions.DryRun(ctx, a)
	case ApplyArgs:
		applied, err := s.cfg.Actions.Apply(ctx, a)
		if err != nil {
			return nil, err
		}
		return map[string]any{"applied": applied}, nil
	case RootRunArgs:
		return s.cfg.Root.Run(ctx, a.Argv)
	}
	switch op.Kind {
	case KindObserveDisk:
		return s.observeDisk()
	case KindObserveProcs:
		return observeProcs(procRoot)
	}
	return nil, fmt.Errorf("ops: no handler for kind %s", op.Kind)
}

// readResult is files:read's answer.
type readResult struct {
	Size int    `json:"size"`
	Data string `json:"data_base64"`
}

// files runs files:list, files:stat and files:read.
func (s *Server) files(kind string, a FilesArgs) (any, error) {
	switch kind {
	case KindFilesList:
		v, err := s.cfg.Files.List(a.Share, a.Path)
		if err != nil {
			return nil, err
		}
		return map[string]any{"entries": v}, nil
	case KindFilesStat:
		v, err := s.cfg.Files.Stat(a.Share, a.Path)
		if err != nil {
			return nil, err
		}
		return map[string]any{"entry": v}, nil
	}
	data, err := s.cfg.Files.Read(a.Share, a.Path)
	if err != nil {
		return nil, err
	}
	if len(data) > MaxRead {
		return nil, denied(ReasonTooLarge, "the file is over 4 MiB")
	}
	return readResult{Size: len(data), Data: base64.StdEncoding.EncodeToString(data)}, nil
}
