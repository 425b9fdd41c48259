package sandbox

import (
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// NobodyID is the uid and gid a sandbox's processes run as unless its
// template says root.
const NobodyID = 65534

// InitPath is where the reaping init is mounted inside a sandbox.
const InitPath = "/.bc-init"

// CgroupParent is the cgroup every sandbox's cgroup is made under.
const CgroupParent = "/bcsandbox"

// defaultPath is the PATH of every sandbox process.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maskedPaths are hidden from the sandbox (bound over with an empty file
// or directory), readonlyPaths are mounted read-only: the usual kernel
// interfaces a container has no business with.
var (
	maskedPaths = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap", "/proc/config.gz", "/proc/kallsyms", "/proc/modules", "/proc/cmdline"}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// user returns the identity a sandbox's processes run as.
func user(root bool) specs.User {
	if root {
		return specs.User{UID: 0, GID: 0}
	}
	return specs.User{UID: NobodyID, GID: NobodyID, AdditionalGids: []uint32{NobodyID}}
}

// noCaps is an empty capability set: the bounding, effective, permitted,
// inheritable and ambient sets are all empty, for root inside too.
func noCaps() *specs.LinuxCapabilities {
	return &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Permitted: []string{}, Inheritable: []string{}, Ambient: []string{}}
}

// processFor returns the process of an exec: argv as given (no shell),
// the sandbox's user, no capabilities, no new privileges, and at most
// 1024 open files and no core dumps. With inherited, the limits are not
// in the process (runc would set them with prlimit, refused for a
// process in a user namespace root does not own): the process inherits
// them from runc, started through rlimitExecProgram.
func processFor(argv, env []string, root, inherited bool) *specs.Process {
	p := &specs.Process{
		User: user(root), Args: argv, Env: env, Cwd: "/",
		Capabilities: noCaps(), NoNewPrivileges: true,
	}
	if !inherited {
		p.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: sandboxNoFile, Soft: sandboxNoFile}, {Type: "RLIMIT_CORE", Hard: sandboxCore, Soft: sandboxCore}}
	}
	return p
}

// Config returns the OCI runtime configuration of a sandbox: rootfs (the
// overlay of the read-only image and the writable layer) at "rootfs",
// PID 1 the reaping init (or initArgv when there is none), new PID,
// mount, IPC, UTS, network and cgroup namespaces (the network namespace
// is fresh, loopback only, unless netns names an egress link's), hostname = the sandbox id, no capabilities,
// no new privileges, the seccomp profile, masked and read-only kernel
// paths, and cgroup limits from the signed spec.
//
// With a valid ids, the sandbox gets its own user namespace mapping its
// ids 0..ids.Size-1 to the host's ids.Base onwards: its root and its
// nobody are host ids no one else has.
func Config(c spec.Create, initHost string, initArgv []string, netns string, ids IDRange) *specs.Spec {
	argv := initArgv
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	if initHost != "" {
		argv = []string{InitPath}
		mounts = append(mounts, specs.Mount{Destination: InitPath, Type: "bind", Source: initHost, Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	p := processFor(argv, []string{defaultPath}, c.Root, ids.Valid())
	memory := c.Limits.MemoryMB << 20
	quota, period := c.Limits.CPUMillis*100, uint64(100000)
	pids := c.Limits.Pids
	deny := false
	namespaces := []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace, Path: netns}, {Type: specs.CgroupNamespace}}
	var uidMap, gidMap []specs.LinuxIDMapping
	if ids.Valid() {
		namespaces = append([]specs.LinuxNamespace{{Type: specs.UserNamespace}}, namespaces...)
		uidMap = []specs.LinuxIDMapping{{ContainerID: 0, HostID: ids.Base, Size: ids.Size}}
		gidMap = uidMap
	}
	return &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "rootfs", Readonly: false},
		Hostname: c.SandboxID,
		Process:  p,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces:  namespaces,
			UIDMappings: uidMap,
			GIDMappings: gidMap,
			CgroupsPath: CgroupParent + "/" + c.SandboxID,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: deny, Access: "rwm"}},
				// No KernelTCP: runc 1.1 ignores it (with a warning); bcd
				// sets the cgroup v1 kernel TCP limit itself (limitKernelTCP).
				Memory: &specs.LinuxMemory{Limit: &memory},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:   &specs.LinuxPids{Limit: &pids},
			},
			Seccomp:       SeccompProfile(),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
}
