package gateway

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// frameStream is a session stream whose first message is m.
type frameStream struct {
	nodev1.Gateway_SessionServer
	m *nodev1.NodeMessage
}

func (s *frameStream) Recv() (*nodev1.NodeMessage, error) { return s.m, nil }

// inventoryDoc is the registry's inventory JSON as inventoryJSON writes it.
type inventoryDoc struct {
	Driver      string `json:"driver"`
	Hostname    string `json:"hostname"`
	CPUs        int32  `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
	GPUs        []struct {
		ID          string `json:"id"`
		Model       string `json:"model"`
		MemoryBytes int64  `json:"memory_bytes"`
	} `json:"gpus"`
	Disks []struct {
		ID        string `json:"id"`
		Model     string `json:"model"`
		SizeBytes int64  `json:"size_bytes"`
	} `json:"disks"`
}

func helloFrame(h *nodev1.Hello) *nodev1.NodeMessage {
	return &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: h}}
}

// nodeFrameSeeds are first frames a node might send: good Hellos, Hellos
// the gateway refuses, and frames that are not a Hello.
func nodeFrameSeeds() []*nodev1.NodeMessage {
	inv := &nodev1.Inventory{Driver: "sim", Hostname: "h1", Cpus: 8, MemoryBytes: 1 << 34,
		Gpus:  []*nodev1.Gpu{{Id: "0", Model: "H100", MemoryBytes: 80 << 30}},
		Disks: []*nodev1.Disk{{Id: "nvme0", Model: "x", SizeBytes: 1 << 40}}}
	many := &nodev1.Inventory{}
	for range 65 {
		many.Gpus = append(many.Gpus, &nodev1.Gpu{Id: "g"})
	}
	return []*nodev1.NodeMessage{
		helloFrame(&nodev1.Hello{NodeId: "n1", BootId: "b1", Version: "v", Labels: map[string]string{"zone": "a"}, Inventory: inv}),
		helloFrame(&nodev1.Hello{NodeId: "n1", BootId: "b1"}),
		helloFrame(&nodev1.Hello{NodeId: "n2", BootId: "b1"}),
		helloFrame(&nodev1.Hello{NodeId: "n1", BootId: strings.Repeat("b", 65)}),
		helloFrame(&nodev1.Hello{NodeId: "n1", BootId: "b1", Inventory: many}),
		helloFrame(&nodev1.Hello{NodeId: "n1", BootId: "b1", Inventory: &nodev1.Inventory{Hostname: strings.Repeat("h", 254)}}),
		{Msg: &nodev1.NodeMessage_Update{Update: &nodev1.CommandUpdate{Body: []byte{1}, NodeSig: []byte{2}}}},
		{Msg: &nodev1.NodeMessage_Ping{Ping: &nodev1.Ping{TimeMs: 1}}},
	}
}

// FuzzNodeFrame feeds arbitrary bytes as a node's first session frame to
// readHello, the gateway's check before anything reaches the registry. No
// frame panics; it is accepted exactly when it is a Hello naming the
// authenticated node with a boot id of 1..64 bytes and an inventory within
// bounds (64 GPUs, 256 disks, a 253-byte hostname); a refusal is
// PERMISSION_DENIED/ACCESS_DENIED or INVALID_ARGUMENT/INVALID_INPUT; and
// the inventory JSON it stores is valid and says what the node sent.
func FuzzNodeFrame(f *testing.F) {
	for _, m := range nodeFrameSeeds() {
		raw, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	g := &Gateway{cfg: Config{Log: slog.New(slog.DiscardHandler)}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var m nodev1.NodeMessage
		if proto.Unmarshal(raw, &m) != nil {
			return
		}
		h := m.GetHello()
		inv := h.GetInventory()
		want := h != nil && h.NodeId == "n1" && h.BootId != "" && len(h.BootId) <= 64 &&
			len(inv.GetGpus()) <= 64 && len(inv.GetDisks()) <= 256 && len(inv.GetHostname()) <= 253
		hello, doc, err := g.readHello(&frameStream{m: &m}, "n1")
		if err != nil {
			st := status.Convert(err)
			refused := (st.Code() == codes.PermissionDenied && st.Message() == string(errs.AccessDenied)) ||
				(st.Code() == codes.InvalidArgument && st.Message() == string(errs.InvalidInput))
			if !refused || want {
				t.Fatalf("refused with %v (a good Hello: %v)", err, want)
			}
			return
		}
		if !want || hello != h {
			t.Fatalf("accepted %v", &m)
		}
		var got inventoryDoc
		if err := json.Unmarshal(doc, &got); err != nil {
			t.Fatalf("inventory JSON %q: %v", doc, err)
		}
		if got.Driver != inv.GetDriver() || got.Hostname != inv.GetHostname() || got.CPUs != inv.GetCpus() ||
			got.MemoryBytes != inv.GetMemoryBytes() || len(got.GPUs) != len(inv.GetGpus()) || len(got.Disks) != len(inv.GetDisks()) {
			t.Fatalf("inventory JSON %q for %v", doc, inv)
		}
		for i, g := range inv.GetGpus() {
			if got.GPUs[i].ID != g.Id || got.GPUs[i].Model != g.Model || got.GPUs[i].MemoryBytes != g.MemoryBytes {
				t.Fatalf("GPU %d: %+v for %v", i, got.GPUs[i], g)
			}
		}
		for i, d := range inv.GetDisks() {
			if got.Disks[i].ID != d.Id || got.Disks[i].Model != d.Model || got.Disks[i].SizeBytes != d.SizeBytes {
				t.Fatalf("disk %d: %+v for %v", i, got.Disks[i], d)
			}
		}
	})
}
