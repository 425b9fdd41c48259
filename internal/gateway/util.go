package gateway

import (
	"encoding/json"
	"errors"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// inventoryJSON renders a node's self-reported inventory for the registry,
// bounding what a node can make the control plane store.
func inventoryJSON(inv *nodev1.Inventory) ([]byte, error) {
	if inv == nil {
		return []byte("{}"), nil
	}
	if len(inv.Gpus) > 64 || len(inv.Disks) > 256 || len(inv.Hostname) > 253 {
		return nil, errors.New("gateway: inventory too large")
	}
	type gpu struct {
		ID          string `json:"id"`
		Model       string `json:"model"`
		MemoryBytes int64  `json:"memory_bytes"`
	}
	type disk struct {
		ID        string `json:"id"`
		Model     string `json:"model"`
		SizeBytes int64  `json:"size_bytes"`
	}
	out := struct {
		Driver      string `json:"driver"`
		Hostname    string `json:"hostname"`
		CPUs        int32  `json:"cpus"`
		MemoryBytes int64  `json:"memory_bytes"`
		GPUs        []gpu  `json:"gpus"`
		Disks       []disk `json:"disks"`
	}{Driver: inv.Driver, Hostname: inv.Hostname, CPUs: inv.Cpus, MemoryBytes: inv.MemoryBytes, GPUs: []gpu{}, Disks: []disk{}}
	for _, g := range inv.Gpus {
		out.GPUs = append(out.GPUs, gpu{g.Id, g.Model, g.MemoryBytes})
	}
	for _, d := range inv.Disks {
		out.Disks = append(out.Disks, disk{d.Id, d.Model, d.SizeBytes})
	}
	return json.Marshal(out)
}
