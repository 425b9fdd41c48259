package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Runtime starts, runs in and removes sandboxes on a host.
type Runtime interface {
	// Name is runc, runsc or sim.
	Name() string
	// Start makes and starts a sandbox from the signed spec as p places
	// it, detached.
	Start(ctx context.Context, c spec.Create, p Placement) error
	// Exec runs argv (no shell) with env in a running sandbox, capturing
	// each stream up to spec.MaxOutput and killing what it started when
	// ctx ends (TimedOut is then set).
	Exec(ctx context.Context, id string, argv, env []string, root bool) (spec.ExecResult, error)
	// Remove stops every process of the sandbox and deletes it and its
	// writable layer; removing a sandbox that does not exist is no error.
	Remove(ctx context.Context, id string) error
	// Running reports whether the sandbox exists in the runtime.
	Running(ctx context.Context, id string) bool
}

// Placement is where a sandbox starts on the host.
type Placement struct {
	// Lower is the image's root filesystem (read-only).
	Lower string
	// NetNS is the network namespace to join (an egress link's), or ""
	// for a fresh one with only loopback.
	NetNS string
	// IDs is the sandbox's block of host ids, or the zero value for no
	// user namespace; UserNS the namespace made for it (NewUserNS), ""
	// when none.
	IDs    IDRange
	UserNS string
	// Restore, when set, fills the sandbox's new, empty writable layer
	// (upper, the overlay's upper directory) before the overlay is
	// mounted, giving what it writes to host uid and gid (the sandbox's
	// user as the host sees it). Its error fails Start.
	Restore func(upper string, uid, gid int) error
	// Memory, when set (runsc), is a directory holding a memory image
	// the sandbox's processes are restored from instead of started.
	Memory string
}

// Liveness is a Runtime that can tell a sandbox whose runtime instance
// died (gVisor's kernel killed at the memory or pids limit) from a live
// one, cheaply enough to ask every second.
type Liveness interface {
	// Alive reports whether the sandbox's first process (runc's init, or
	// gVisor's sandbox process) still runs in the sandbox's cgroup.
	Alive(id string) bool
}

// UserNamespaces is a Runtime that runs sandboxes in user namespaces
// bcd makes (runc on amd64).
type UserNamespaces interface {
	// NewUserNS makes the user namespace (and a network namespace it
	// owns) of a sandbox with ids, or returns nil when the runtime runs
	// none; the caller closes it once the sandbox started.
	NewUserNS(id string, ids IDRange) (*UserNS, error)
}

// OCI drives an OCI runtime binary (runc, or gVisor's runsc) through
// bundles under dir: dir/state is the runtime's --root, dir/bundles/<id>
// holds config.json, the writable layer (a tmpfs the size of the disk
// limit, holding the overlay's upper and work directories) and rootfs,
// the overlay of the image over it. Every argv is fixed; a sandbox id is
// validated before it names anything.
type OCI struct {
	name   string
	binary string
	dir    string
	// bundles holds the bundles: dir/bundles, or for runc run as root a
	// folder under RunBase (see runBundles).
	bundles string
	init    []byte // the reaping init (nil when none for this architecture)
	userns  []byte // the user namespace maker (nil when none)
	// rlexec is the path of rlimitExecProgram under dir ("" when none):
	// runc runs through it for sandboxes with a user namespace.
	rlexec string
}

// NewOCI returns the runtime called name using binary, with its state
// under dir.
func NewOCI(name, binary, dir string) (*OCI, error) {
	bundles := filepath.Join(dir, "bundles")
	if name == spec.RuntimeRunc && os.Geteuid() == 0 {
		var err error
		if bundles, err = runBundles(RunBase, dir); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{filepath.Join(dir, "state"), bundles} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("sandbox: %s dir: %w", name, err)
		}
	}
	o := &OCI{name: name, binary: binary, dir: dir, bundles: bundles, init: initProgram()}
	if name == spec.RuntimeRunc {
		if rl := rlimitExecProgram(); rl != nil {
			o.rlexec = filepath.Join(dir, "rlimit-exec")
			if err := pki.WriteFileAtomic(o.rlexec, rl, 0o500); err != nil {
				return nil, fmt.Errorf("sandbox: %s rlimit program: %w", name, err)
			}
			o.userns = usernsProgram()
		}
	}
	return o, nil
}

// Name returns the runtime's name.
func (o *OCI) Name() string { return o.name }

// RunBase is where runc hosts run as root keep their bundles: outside
// bcd's data folder, so that the folder (and whatever holds it, such as a
// home directory) stays closed to others.
const RunBase = "/run/bcd-sandboxes"

// runBundles returns, and makes, the bundles folder of the host whose
// state is in dir: base/<digest of dir>/bundles, each level root's and
// mode 0711. runc's init enters the sandbox's user namespace before it
// mounts the rootfs and the init from the bundle, as the sandbox's root,
// a host id that owns none of the path, so it must be able to walk there;
// 0711 lets it search without listing, and /run above is root's 0755.
// A level that exists but is not a directory of root's, or that others
// can write, is refused.
func runBundles(base, dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("sandbox: bundles: %w", err)
	}
	sum := sha256.Sum256([]byte(abs))
	host := filepath.Join(base, hex.EncodeToString(sum[:8]))
	bundles := filepath.Join(host, "bundles")
	for _, d := range []string{base, host, bundles} {
		if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("sandbox: bundles: %w", err)
		}
		fi, err := os.Lstat(d)
		if err != nil {
			return "", fmt.Errorf("sandbox: bundles: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || !ok || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			return "", fmt.Errorf("sandbox: bundles: %s must be a directory of root's that no one else can write", d)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return "", fmt.Errorf("sandbox: bundles: %w", err)
		}
	}
	return bundles, nil
}

// argv is the runtime's argument vector: its state root, the runtime's
// own global flags, globals, then args. runsc runs on the ptrace
// platform (no KVM needed).
func (o *OCI) argv(globals []string, args ...string) []string {
	out := []string{"--root", filepath.Join(o.dir, "state")}
	if o.name == spec.RuntimeRunsc {
		out = append(out, "--platform=ptrace")
	}
	out = append(out, globals...)
	return append(out, args...)
}

func (o *OCI) bundle(id string) string { return filepath.Join(o.bundles, id) }

// run runs the runtime binary with fixed arguments and returns its
// output on failure. It is for commands that end (state, kill, delete):
// the output goes to a temporary file read back on failure. A command
// that leaves the sandbox running uses runDetached instead.
func (o *OCI) run(ctx context.Context, args ...string) error {
	return o.runWith(ctx, nil, args...)
}

// runWith is run with extra global flags (before the subcommand).
func (o *OCI) runWith(ctx context.Context, globals []string, args ...string) error {
	out, err := os.CreateTemp(o.dir, "out-*")
	if err != nil {
		return fmt.Errorf("sandbox: runtime output: %w", err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.CommandContext(ctx, o.binary, o.argv(globals, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		msg := strings.TrimSpace(string(b))
		if len(msg) > 512 {
			msg = msg[:512]
		}
		return fmt.Errorf("%s %s: %w: %s", o.name, args[0], err, msg)
	}
	return nil
}

// Start prepares the bundle and runs `runc run -d`: the writable layer,
// the image beneath it (id-mapped for a sandbox with its own ids), the
// overlay root, the init, the OCI config, then the runtime.
func (o *OCI) Start(ctx context.Context, c spec.Create, p Placement) error {
	if err := spec.ValidSandboxID(c.SandboxID); err != nil {
		return err
	}
	lower, netns, ids, usernsPath := p.Lower, p.NetNS, p.IDs, p.UserNS
	if o.userns == nil {
		// gVisor's processes are not host processes; and without the
		// namespace program (not amd64) no user namespace.
		ids, usernsPath = IDRange{}, ""
	}
	b := o.bundle(c.SandboxID)
	rw := filepath.Join(b, "rw")
	if err := writableLayer(b, c.Limits.DiskMB, ids); err != nil {
		return err
	}
	if p.Restore != nil {
		uid, gid := sandboxOwner(c.Root, ids)
		if err := p.Restore(filepath.Join(rw, "upper"), uid, gid); err != nil {
			return err
		}
	}
	if ids.Valid() {
		if usernsPath == "" {
			// The helper dies with the thread that started it: keep it
			// (see Host.launch).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ns, err := o.NewUserNS(c.SandboxID, ids)
			if err != nil {
				return err
			}
			if ns == nil {
				return errors.New("sandbox: no user namespace")
			}
			// runc joins the namespace; once the sandbox's init is in
			// it, the helper can go.
			defer ns.Close()
			usernsPath = ns.Path
		}
		if err := idmappedImage(b, lower, usernsPath); err != nil {
			return err
		}
	} else if err := bindImage(b, lower); err != nil {
		return err
	}
	if err := mountOverlayIn(b); err != nil {
		return err
	}
	initHost, err := o.placeInit(rw, c.Root, ids)
	if err != nil {
		return err
	}
	if err := o.writeConfig(c, b, initHost, netns, ids, usernsPath); err != nil {
		return err
	}
	if o.name == spec.RuntimeRunc {
		// gVisor's sockets are the Sentry's own memory, under the memory
		// limit already; and runsc leaves a cgroup it did not make
		// unlimited, so it gets none made ahead.
		if err := limitKernelTCP(c.SandboxID, kernelTCPLimit(c.Limits.MemoryMB)); err != nil {
			return err
		}
	}
	args := []string{"run", "--detach", "--bundle", b, "--pid-file", filepath.Join(b, "init.pid")}
	if p.Memory != "" && o.name == spec.RuntimeRunsc {
		args = []string{"restore", "--image-path", p.Memory, "--detach", "--bundle", b, "--pid-file", filepath.Join(b, "init.pid")}
	}
	var globals []string
	switch o.name {
	case spec.RuntimeRunc:
		args = append(args, "--no-new-keyring")
	case spec.RuntimeRunsc:
		// gVisor's netstack with loopback only (--network=none); the
		// host refuses egress on runsc before anything starts.
		if netns == "" {
			globals = append(globals, "--network=none")
		}
	}
	return o.runDetached(ctx, b, globals, append(args, c.SandboxID)...)
}

// sandboxOwner is the host uid and gid of the user a sandbox runs as:
// its user mapped through ids when it has its own.
func sandboxOwner(root bool, ids IDRange) (int, int) {
	u := user(root)
	if ids.Valid() {
		return ids.Host(u.UID), ids.Host(u.GID)
	}
	return int(u.UID), int(u.GID)
}

// LayerDir returns the host directory of sandbox id's writable layer
// (the overlay's upper directory).
func (o *OCI) LayerDir(id string) (string, error) {
	if err := spec.ValidSandboxID(id); err != nil {
		return "", err
	}
	d := filepath.Join(o.bundle(id), "rw", "upper")
	if _, err := os.Lstat(d); err != nil {
		return "", fmt.Errorf("sandbox: layer: %w", err)
	}
	return d, nil
}

// Pause freezes every process of the sandbox (runc/runsc pause).
func (o *OCI) Pause(ctx context.Context, id string) error {
	if err := spec.ValidSandboxID(id); err != nil {
		return err
	}
	return o.run(ctx, "pause", id)
}

// Resume thaws the sandbox's processes (runc/runsc resume).
func (o *OCI) Resume(ctx context.Context, id string) error {
	if err := spec.ValidSandboxID(id); err != nil {
		return err
	}
	return o.run(ctx, "resume", id)
}

// CheckpointMemory saves a gVisor sandbox's processes into dir, runs
// stopped while the sandbox is down, and restarts it from what it saved
// (see MemoryCheckpointer); other runtimes refuse.
//
// runsc's own --leave-running waits on the sandbox it restarts, so the
// restart is done here instead, detached: checkpoint (which ends the
// sandbox), delete the stopped instance, then restore it from the image
// it just saved, on the same bundle (the overlay and its layer stay
// mounted), like run (no network, standard streams /dev/null, errors to
// the bundle's log), with a fresh pid file.
func (o *OCI) CheckpointMemory(ctx context.Context, id, dir string, stopped func() error) error {
	if err := spec.ValidSandboxID(id); err != nil {
		return err
	}
	if o.name != spec.RuntimeRunsc {
		return errors.New(spec.ReasonMemoryNeedsRunsc)
	}
	if err := o.run(ctx, "checkpoint", "--image-path", dir, id); err != nil {
		return err
	}
	serr := stopped()
	if err := o.run(ctx, "delete", "--force", id); err != nil {
		return err
	}
	b := o.bundle(id)
	if err := o.runDetached(ctx, b, []string{"--network=none"}, "restore", "--image-path", dir, "--detach",
		"--bundle", b, "--pid-file", filepath.Join(b, "init.pid"), id); err != nil {
		return err
	}
	return serr
}

// writableLayer makes bundle b's rootfs directory and its writable layer
// rw: a tmpfs the size of the disk limit, whose pages are charged to the
// sandbox's memory cgroup as they are written, holding the overlay's
// upper and work directories (owned by the sandbox's root when it has its
// own ids).
func writableLayer(b string, diskMB int64, ids IDRange) error {
	rw, rootfs := filepath.Join(b, "rw"), filepath.Join(b, "rootfs")
	for _, d := range []string{rw, rootfs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("sandbox: bundle: %w", err)
		}
	}
	if ids.Valid() {
		// Searchable by the sandbox's root (see runBundles).
		if err := os.Chmod(b, 0o701); err != nil {
			return fmt.Errorf("sandbox: bundle: %w", err)
		}
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%dm,mode=0755", diskMB)); err != nil {
		return fmt.Errorf("sandbox: writable layer: %w", err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(rw, d), 0o755); err != nil {
			return fmt.Errorf("sandbox: writable layer: %w", err)
		}
	}
	if !ids.Valid() {
		return nil
	}
	// The sandbox's root owns its writable layer.
	for _, d := range []string{rw, filepath.Join(rw, "upper"), filepath.Join(rw, "work")} {
		if err := os.Chown(d, ids.Host(0), ids.Host(0)); err != nil {
			return fmt.Errorf("sandbox: writable layer: %w", err)
		}
	}
	return nil
}

// idmappedImage mounts the image at bundle b's lower through an idmapped
// mount of the user namespace at usernsPath, so that the sandbox sees
// the image as its own root's files.
func idmappedImage(b, lower, usernsPath string) error {
	mapped := filepath.Join(b, "lower")
	if err := os.Mkdir(mapped, 0o700); err != nil {
		return fmt.Errorf("sandbox: id-mapped image: %w", err)
	}
	return idmappedMount(lower, mapped, usernsPath)
}

// bindImage binds the image read-only into bundle b too, so that the
// overlay names no path outside it.
func bindImage(b, lower string) error {
	if err := os.Mkdir(filepath.Join(b, "lower"), 0o700); err != nil {
		return fmt.Errorf("sandbox: image bind: %w", err)
	}
	if err := unix.Mount(lower, filepath.Join(b, "lower"), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("sandbox: image bind: %w", err)
	}
	if err := unix.Mount("", filepath.Join(b, "lower"), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("sandbox: image bind: %w", err)
	}
	return nil
}

// placeInit gives the bundle its own copy of the init, owned by the
// sandbox's user and executable by it alone, and returns its host path
// ("" without an init).
func (o *OCI) placeInit(rw string, root bool, ids IDRange) (string, error) {
	if o.init == nil {
		return "", nil
	}
	// In the writable layer's tmpfs, beside (not in) the overlay's
	// directories: the bind's root in the sandbox's mountinfo is then
	// "/bc-init" on a tmpfs, no host path.
	initHost := filepath.Join(rw, "bc-init")
	if err := writeProgram(initHost, o.init, 0o500); err != nil {
		return "", fmt.Errorf("sandbox: write init: %w", err)
	}
	u := user(root)
	uid, gid := int(u.UID), int(u.GID)
	if ids.Valid() {
		uid, gid = ids.Host(u.UID), ids.Host(u.GID)
	}
	if err := os.Chown(initHost, uid, gid); err != nil {
		return "", fmt.Errorf("sandbox: own init: %w", err)
	}
	return initHost, nil
}

// writeConfig writes bundle b's config.json: the sandbox's OCI spec, its
// /tmp on runsc, and the user namespace it joins.
func (o *OCI) writeConfig(c spec.Create, b, initHost, netns string, ids IDRange, usernsPath string) error {
	cfg := Config(c, initHost, []string{"/bin/sleep", "2147483647"}, netns, ids)
	if o.name == spec.RuntimeRunsc {
		// gVisor mounts a tmpfs of its own, in the Sentry's memory and
		// bounded by nothing, over /tmp unless the spec mounts one: bind
		// a directory of the writable layer, so /tmp counts against the
		// disk limit like the rest of the root.
		tmp := filepath.Join(b, "rw", "tmp")
		if err := os.Mkdir(tmp, 0o777); err != nil {
			return fmt.Errorf("sandbox: /tmp: %w", err)
		}
		if err := os.Chmod(tmp, 0o1777); err != nil {
			return fmt.Errorf("sandbox: /tmp: %w", err)
		}
		cfg.Mounts = append(cfg.Mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: tmp, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	if usernsPath != "" {
		for i, n := range cfg.Linux.Namespaces {
			if n.Type == specs.UserNamespace {
				cfg.Linux.Namespaces[i].Path = usernsPath
			}
		}
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("sandbox: encode config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(b, "config.json"), raw, 0o600); err != nil {
		return fmt.Errorf("sandbox: write config: %w", err)
	}
	return nil
}

// mountOverlayIn mounts the sandbox's root filesystem at bundle/rootfs:
// the overlay of bundle/lower under bundle/rw/upper. The overlay's
// options appear in the sandbox's /proc/self/mountinfo as given, so they
// are given relative to the bundle: a thread of its own (its own working
// directory, unshared from the rest of the process, and never reused)
// changes into the bundle and mounts from there.
func mountOverlayIn(bundle string) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, its working
		// directory with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("sandbox: overlay: %w", err)
			return
		}
		if err := unix.Chdir(bundle); err != nil {
			errc <- fmt.Errorf("sandbox: overlay: %w", err)
			return
		}
		if err := unix.Mount("overlay", "rootfs", "overlay", unix.MS_NOSUID|unix.MS_NODEV, "lowerdir=lower,upperdir=rw/upper,workdir=rw/work"); err != nil {
			errc <- fmt.Errorf("sandbox: overlay: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// NewUserNS makes a sandbox's user namespace (see UserNamespaces), or
// returns nil when this runtime runs none (runsc; not amd64). The
// namespace program is left in the bundle, which marks the sandbox as
// one with a user namespace.
func (o *OCI) NewUserNS(id string, ids IDRange) (*UserNS, error) {
	if err := spec.ValidSandboxID(id); err != nil {
		return nil, err
	}
	if o.userns == nil || !ids.Valid() {
		return nil, nil
	}
	b := o.bundle(id)
	if err := os.MkdirAll(b, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: bundle: %w", err)
	}
	// Searchable by the sandbox's root (see runBundles), which runs the
	// program from here.
	if err := os.Chmod(b, 0o701); err != nil {
		return nil, fmt.Errorf("sandbox: bundle: %w", err)
	}
	prog := filepath.Join(b, "userns")
	if err := writeProgram(prog, o.userns, 0o555); err != nil {
		return nil, fmt.Errorf("sandbox: user namespace program: %w", err)
	}
	return newUserNS(prog, ids)
}

// runDetached runs the runtime for a command that leaves the sandbox
// running (run --detach). The sandbox's PID 1 inherits the runtime's
// standard streams and keeps them for its whole life, and any process in
// the sandbox can reopen them through /proc/1/fd: so they are /dev/null
// (os/exec's default), never a file on the host's disk, which a sandbox
// could fill (fallocate on /proc/1/fd/1) past its own disk limit. The
// runtime's own errors go to its --log file in the bundle, which only the
// runtime writes, and are read back on failure.
func (o *OCI) runDetached(ctx context.Context, bundle string, globals []string, args ...string) error {
	logPath := filepath.Join(bundle, "runtime.log")
	cmd := o.command(ctx, o.hasUserNS(bundle), o.argv(append([]string{"--log", logPath}, globals...), args...))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", o.name, args[0], err, tail(logPath, 512))
	}
	return nil
}

// command is the runtime binary with args, through rlimitExecProgram
// when inherited (the sandbox's processes inherit their limits).
func (o *OCI) command(ctx context.Context, inherited bool, args []string) *exec.Cmd {
	if inherited {
		return exec.CommandContext(ctx, o.rlexec, append([]string{o.binary}, args...)...)
	}
	return exec.CommandContext(ctx, o.binary, args...)
}

// hasUserNS reports whether the sandbox of bundle runs in its own user
// namespace (Start left the namespace program in its bundle).
func (o *OCI) hasUserNS(bundle string) bool {
	_, err := os.Stat(filepath.Join(bundle, "userns"))
	return err == nil
}

// tail returns at most the last n bytes of the file at p, trimmed.
func tail(p string, n int64) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-n, 0)
	b := make([]byte, fi.Size()-off)
	_, _ = f.ReadAt(b, off)
	return strings.TrimSpace(string(b))
}

// Exec runs argv inside the sandbox with `runc exec --process FILE`: the
// whole process (argv, env, user, no capabilities, no new privileges)
// comes from a file (in memory: processFile), so nothing in argv is ever
// parsed as a runc flag.
func (o *OCI) Exec(ctx context.Context, id string, argv, env []string, root bool) (spec.ExecResult, error) {
	var res spec.ExecResult
	if err := spec.ValidSandboxID(id); err != nil {
		return res, err
	}
	b := o.bundle(id)
	inherited := o.hasUserNS(b)
	pf, err := processFile(processFor(argv, append([]string{defaultPath}, env...), root, inherited))
	if err != nil {
		return res, err
	}
	defer pf.Close()
	// runc's own errors go to a log of this exec (read back by
	// notStarted), never mixed into the program's stderr.
	var globals []string
	logPath := filepath.Join(b, "exec-"+ids.New("x")+".log")
	if o.name == spec.RuntimeRunc {
		globals = []string{"--log", logPath, "--log-format", "json"}
		defer os.Remove(logPath)
	}
	cmd := o.command(context.Background(), inherited, o.argv(globals, "exec", "--process", processFD, id))
	cmd.ExtraFiles = []*os.File{pf}
	stdout, stderr := &capped{max: spec.MaxOutput}, &capped{max: spec.MaxOutput}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("sandbox: start exec: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		res.TimedOut = true
		// Kill everything the exec started (forks included), keep PID 1.
		o.killAllButInit(id)
		select {
		case werr = <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			werr = <-done
		}
	}
	res.Stdout, res.StdoutTruncated = stdout.buf.Bytes(), stdout.truncated
	res.Stderr, res.StderrTruncated = stderr.buf.Bytes(), stderr.truncated
	var ee *exec.ExitError
	switch {
	case werr == nil:
	case errors.As(werr, &ee):
		res.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal())
		}
	default:
		return res, fmt.Errorf("sandbox: exec: %w", werr)
	}
	if res.TimedOut && res.ExitCode == 0 {
		res.ExitCode = 137
	}
	if res.TimedOut || o.name != spec.RuntimeRunc {
		return res, nil
	}
	return notStarted(res, argv, logPath)
}

// killAllButInit freezes the sandbox, SIGKILLs every process in its
// cgroup but PID 1, and thaws it, so a fork bomb cannot outrun the kill.
func (o *OCI) killAllButInit(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	initPID := 0
	if b, err := os.ReadFile(filepath.Join(o.bundle(id), "init.pid")); err == nil {
		initPID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if o.name == spec.RuntimeRunsc {
		// The cgroup holds gVisor's own processes (the Sentry and its
		// stubs): kill inside the sandbox instead.
		o.killInsideRunsc(ctx, id)
		return
	}
	paused := o.run(ctx, "pause", id) == nil
	for _, p := range cgroupProcs(id) {
		if p != initPID && p > 1 {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}
	if paused {
		_ = o.run(ctx, "resume", id)
	}
}

// killInsideRunsc SIGKILLs every process of a gVisor sandbox but its
// PID 1, as runsc's own process table lists them.
func (o *OCI) killInsideRunsc(ctx context.Context, id string) {
	out, err := exec.CommandContext(ctx, o.binary, o.argv(nil, "ps", "--format", "json", id)...).Output()
	if err != nil {
		return
	}
	var pids []int // runsc ps --format json lists the pids alone
	if json.Unmarshal(out, &pids) != nil {
		return
	}
	for _, p := range pids {
		if p > 1 {
			_ = o.run(ctx, "kill", "--pid", strconv.Itoa(p), id, "KILL")
		}
	}
}

// cgroupProcs lists the host pids in a sandbox's cgroup (v1 pids
// controller, or the v2 unified hierarchy).
func cgroupProcs(id string) []int {
	var out []int
	for _, p := range []string{"/sys/fs/cgroup/pids" + CgroupParent + "/" + id + "/cgroup.procs", "/sys/fs/cgroup" + CgroupParent + "/" + id + "/cgroup.procs"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		break
	}
	return out
}

// Remove kills and deletes the sandbox, then unmounts and removes its
// bundle.
func (o *OCI) Remove(ctx context.Context, id string) error {
	if err := spec.ValidSandboxID(id); err != nil {
		return err
	}
	if o.Running(ctx, id) {
		_ = o.run(ctx, "kill", "--all", id, "KILL")
		if err := o.run(ctx, "delete", "--force", id); err != nil {
			return err
		}
	}
	b := o.bundle(id)
	for _, m := range []string{filepath.Join(b, "rootfs"), filepath.Join(b, "lower"), filepath.Join(b, "rw")} {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("sandbox: unmount %s: %w", filepath.Base(m), err)
		}
	}
	if err := os.RemoveAll(b); err != nil {
		return fmt.Errorf("sandbox: remove bundle: %w", err)
	}
	return removeMemoryCgroup(id)
}

// memoryCgroupV1 is the sandboxes' memory cgroup directory on a cgroup v1
// host.
const memoryCgroupV1 = "/sys/fs/cgroup/memory" + CgroupParent

// kernelTCPLimit is the kernel TCP buffer limit of a sandbox with
// memoryMB of memory: a quarter of it. cgroup v1 counts socket buffers
// apart from memory.limit_in_bytes, and the kernel lets each socket
// queue a little past the limit, so a quarter keeps a sandbox's memory
// and socket buffers together within its memory limit plus a quarter
// plus those per-socket minimums.
func kernelTCPLimit(memoryMB int64) int64 { return memoryMB << 20 / 4 }

// limitKernelTCP makes the sandbox's memory cgroup ahead of runc on a
// cgroup v1 host and sets its kernel TCP limit
// (memory.kmem.tcp.limit_in_bytes): v1 charges socket
// buffers to a cgroup only once that limit is set, before any socket,
// and the runtimes here do not set it (runc 1.1 ignores the spec's
// kernelTCP). The runtime then uses the cgroup as it finds it. On cgroup
// v2 socket memory counts under memory.max with nothing to set, and this
// does nothing.
func limitKernelTCP(id string, limit int64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup/memory", &fs); err != nil || fs.Type != unix.CGROUP_SUPER_MAGIC {
		return nil
	}
	dir := filepath.Join(memoryCgroupV1, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sandbox: memory cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.kmem.tcp.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		return fmt.Errorf("sandbox: kernel TCP limit: %w", err)
	}
	return nil
}

// removeMemoryCgroup removes the v1 memory cgroup limitKernelTCP made, if
// the runtime left it.
func removeMemoryCgroup(id string) error {
	if err := unix.Rmdir(filepath.Join(memoryCgroupV1, id)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("sandbox: remove memory cgroup: %w", err)
	}
	return nil
}

// Alive reports whether the process in the sandbox's pid file still
// runs, in the sandbox's own cgroup (so a reused pid does not count).
func (o *OCI) Alive(id string) bool {
	_, ok := o.initPID(id)
	return ok
}

// initPID returns the pid in the sandbox's pid file when that process
// still runs, in the sandbox's own cgroup (so a reused pid does not
// count).
func (o *OCI) initPID(id string) (int, bool) {
	if spec.ValidSandboxID(id) != nil {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(o.bundle(id), "init.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	// The state follows the parenthesised command name: Z is a zombie.
	if i := strings.LastIndexByte(string(stat), ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return 0, false
	}
	cg, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	return pid, err == nil && strings.Contains(string(cg), CgroupParent+"/"+id)
}

// Running reports whether the runtime knows the sandbox.
func (o *OCI) Running(ctx context.Context, id string) bool {
	return spec.ValidSandboxID(id) == nil && o.run(ctx, "state", id) == nil
}

// capped keeps the first max bytes written and counts the rest away, so a
// process writing without end never blocks and never grows memory.
type capped struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
			c.truncated = true
		} else {
			c.buf.Write(p)
		}
	} else if len(p) > 0 {
		c.truncated = true
	}
	return len(p), nil
}

// processFD is where a runtime started with processFile's file as its
// first extra file finds it: `--process processFD`.
const processFD = "/proc/self/fd/3"

// processFile writes proc, as `runc exec --process` reads it, into an
// anonymous memory file (memfd): the process's environment holds the
// values of the sandbox's secret references, which must never reach a
// file on disk, not even briefly (a crash between writing and removing a
// file would leave them in the host's data folder). The caller passes it
// as the command's first extra file and closes it after the command
// started.
func processFile(proc *specs.Process) (*os.File, error) {
	fd, err := unix.MemfdCreate("bc-process", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sandbox: process file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "bc-process")
	if err := json.NewEncoder(f).Encode(proc); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: process file: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: process file: %w", err)
	}
	return f, nil
}

// writeProgram writes a file that is about to be run while no fork can
// happen (it holds syscall.ForkLock, which every fork holds for writing):
// a child another goroutine forks while the file is open for writing
// keeps the descriptor until that child execs, and running the file in
// that window fails with ETXTBSY ("text file busy", golang.org/issue/22315).
// Sandboxes start side by side, each writing its own programs while the
// others fork runtimes.
func writeProgram(path string, data []byte, mode os.FileMode) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	return os.WriteFile(path, data, mode)
}
