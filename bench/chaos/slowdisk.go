package main

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// slowDisk is a FUSE loopback file system served by the harness itself
// (go-fuse) over a folder of the real disk, whose writes and fsyncs wait
// a settable delay: a slow disk under one node's data folder, journal
// included, with every byte still on the real disk. The kernel's
// device-mapper delay target would do the same below the file system,
// but this machine's kernel has no device mapper (/dev/mapper/control
// answers ENODEV); FUSE is what it has.
type slowDisk struct {
	mount   string
	backing string
	server  *fuse.Server
	delay   atomic.Int64 // nanoseconds
	delayed atomic.Int64 // writes and fsyncs that waited (a nonzero delay)
}

// newSlowDisk mounts the slow file system at dir/mnt over dir/backing. It
// returns nil and why when this machine cannot (no /dev/fuse, not root).
func newSlowDisk(dir string) (*slowDisk, string) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, "no /dev/fuse on this machine (and no device mapper): " + err.Error()
	}
	if os.Geteuid() != 0 {
		return nil, "mounting FUSE directly needs root"
	}
	d := &slowDisk{mount: filepath.Join(dir, "mnt"), backing: filepath.Join(dir, "backing")}
	for _, p := range []string{d.mount, d.backing} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, err.Error()
		}
	}
	root := &fs.LoopbackRoot{Path: d.backing}
	var st syscall.Stat_t
	if err := syscall.Stat(d.backing, &st); err != nil {
		return nil, err.Error()
	}
	root.Dev = uint64(st.Dev)
	// The root is a slowNode; every node below it is wrapped into one as
	// it is made (WrapChild).
	root.RootNode = &slowNode{LoopbackNode: &fs.LoopbackNode{RootData: root}, disk: d}
	srv, err := fs.Mount(d.mount, root.RootNode, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMount: true, FsName: "bc-chaos-slow", Name: "bcchaos",
	}})
	if err != nil {
		return nil, "FUSE mount failed: " + err.Error()
	}
	d.server = srv
	return d, ""
}

func (d *slowDisk) setDelay(v time.Duration) { d.delay.Store(int64(v)) }

func (d *slowDisk) wait() {
	if v := time.Duration(d.delay.Load()); v > 0 {
		d.delayed.Add(1)
		time.Sleep(v)
	}
}

func (d *slowDisk) close() {
	if d.server != nil {
		_ = d.server.Unmount()
	}
}

// slowNode is a loopback node whose files are slowFiles.
type slowNode struct {
	*fs.LoopbackNode
	disk *slowDisk
}

var _ = (fs.NodeOpener)((*slowNode)(nil))
var _ = (fs.NodeCreater)((*slowNode)(nil))
var _ = (fs.NodeWrapChilder)((*slowNode)(nil))

// WrapChild makes every node the loopback creates below n a slowNode too.
func (n *slowNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &slowNode{LoopbackNode: ln, disk: n.disk}
	}
	return ops
}

func (n *slowNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fl, errno
}

func (n *slowNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, n.wrap(fh), fl, errno
}

func (n *slowNode) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &slowFile{LoopbackFile: lf, disk: n.disk}
	}
	return fh
}

// slowFile delays writes and fsyncs.
type slowFile struct {
	*fs.LoopbackFile
	disk *slowDisk
}

func (f *slowFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.disk.wait()
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *slowFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	f.disk.wait()
	return f.LoopbackFile.Fsync(ctx, flags)
}

// PassthroughFd refuses FUSE passthrough: with it the kernel would write
// to the backing file directly and never ask this server, so no delay.
func (f *slowFile) PassthroughFd() (int, bool) { return 0, false }
