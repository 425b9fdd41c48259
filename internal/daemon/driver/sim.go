package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Sim is a simulated GPU machine: 64 CPUs, 8 GPUs and 2 NVMe disks. It keeps
// the effects of destructive kinds (a reboot count, wiped disks, GPU
// resets) so tests can see that a command ran, and how many times.
type Sim struct {
	hostname string

	mu      sync.Mutex
	reboots int
	resets  map[string]int
	wiped   map[string]int
	runs    map[string]int
}

// NewSim returns a simulated machine called hostname.
func NewSim(hostname string) *Sim {
	return &Sim{hostname: hostname, resets: map[string]int{}, wiped: map[string]int{}, runs: map[string]int{}}
}

// Name returns "sim".
func (s *Sim) Name() string { return "sim" }

// Inventory returns the simulated hardware.
func (s *Sim) Inventory() *nodev1.Inventory {
	inv := &nodev1.Inventory{Driver: "sim", Hostname: s.hostname, Cpus: 64, MemoryBytes: 512 << 30}
	for i := 0; i < 8; i++ {
		inv.Gpus = append(inv.Gpus, &nodev1.Gpu{Id: fmt.Sprintf("gpu%d", i), Model: "SIM-H100", MemoryBytes: 80 << 30, PciAddress: fmt.Sprintf("0000:%02x:00.0", 0x18+i)})
	}
	for i := 0; i < 2; i++ {
		inv.Disks = append(inv.Disks, &nodev1.Disk{Id: fmt.Sprintf("nvme%dn1", i), Model: "SIM-NVME", SizeBytes: 4 << 40})
	}
	return inv
}

// Runs returns how many times kind ran on this machine.
func (s *Sim) Runs(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[kind]
}

// Run executes a kind on the simulated machine.
func (s *Sim) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[kind]++
	switch kind {
	case kinds.NodePing:
		return json.Marshal(map[string]any{"pong": true, "hostname": s.hostname})
	case kinds.DiagRun:
		type check struct {
			Name string `json:"name"`
			OK   bool   `json:"ok"`
		}
		checks := []check{{"cpu", true}, {"memory", true}}
		for i := 0; i < 8; i++ {
			checks = append(checks, check{fmt.Sprintf("gpu%d", i), true})
		}
		return json.Marshal(map[string]any{"driver": "sim", "hostname": s.hostname, "healthy": true, "checks": checks})
	case kinds.SecretDigest:
		return secretDigest(ctx, payload)
	case kinds.NodeReboot:
		s.reboots++
		return json.Marshal(map[string]any{"rebooted": true, "reboots": s.reboots})
	case kinds.GPUReset:
		return s.resetGPU(payload)
	case kinds.DiskWipe:
		var p struct {
			Disks []string `json:"disks"`
		}
		if len(payload) > 0 {
			if err := json.Unmarshal(payload, &p); err != nil {
				return nil, fmt.Errorf("payload-invalid")
			}
		}
		if len(p.Disks) == 0 {
			p.Disks = []string{"nvme0n1", "nvme1n1"}
		}
		for _, d := range p.Disks {
			if d != "nvme0n1" && d != "nvme1n1" {
				return nil, fmt.Errorf("unknown-disk")
			}
			s.wiped[d]++
		}
		return json.Marshal(map[string]any{"wiped": p.Disks})
	default:
		return nil, ErrUnsupported
	}
}

// resetGPU runs gpu.reset: payload {"gpu":"<id>"} naming one of the
// simulated GPUs, else the error "gpu-unknown" (or "payload-invalid").
// The caller holds s.mu.
func (s *Sim) resetGPU(payload []byte) ([]byte, error) {
	var p struct {
		GPU string `json:"gpu"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return nil, fmt.Errorf("payload-invalid")
	}
	for _, g := range s.Inventory().Gpus {
		if g.Id == p.GPU {
			s.resets[p.GPU]++
			return json.Marshal(map[string]any{"reset": p.GPU, "resets": s.resets[p.GPU]})
		}
	}
	return nil, fmt.Errorf("gpu-unknown")
}
