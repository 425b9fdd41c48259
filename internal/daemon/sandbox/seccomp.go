package sandbox

import (
	"runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The seccomp profile of every runc sandbox. runc has no built-in profile,
// so bcd writes one: the default action refuses with EPERM, and only the
// system calls an ordinary unprivileged Linux program uses are allowed.
// The list follows the shape of the well-known Moby/Docker default profile
// (its unconditional allow list, without the entries that need a
// capability the sandbox never has), written out here rather than copied.
// Left out on purpose, among others: mount/umount2/pivot_root, unshare and
// setns (no new namespaces, in particular no user namespaces), bpf,
// perf_event_open, userfaultfd, keyctl/add_key/request_key, kexec_*,
// *_module, ptrace, process_vm_*, personality changes, reboot, swapon,
// acct, quotactl, open_by_handle_at, name_to_handle_at, iopl/ioperm,
// clock_settime/settimeofday, and io_uring_*. clone is allowed only
// without namespace flags, and clone3 answers ENOSYS so C libraries fall
// back to clone, whose flags the filter can see.
//
// Only the native architecture is allowed: a call through another ABI
// (int 0x80 or x32 on x86-64, AArch32 on arm64) matches no architecture
// of the filter and kills the process, as the seed's plugin filter does.
// The foreign ABIs bring the multiplexers socketcall and ipc, whose
// arguments the filter cannot read (socketcall(SYS_SOCKET, {AF_VSOCK})
// went around the socket rule); neither is on the list either.
var allowedSyscalls = []string{
	"accept", "accept4", "access", "alarm", "arch_prctl", "bind", "brk",
	"capget", "capset", "chdir", "chmod", "chown", "chown32", "clock_getres", "clock_getres_time64",
	"clock_gettime", "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range",
	"connect", "copy_file_range", "creat", "dup", "dup2", "dup3",
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old",
	"eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group",
	"faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark",
	"fchdir", "fchmod", "fchmodat", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync",
	"fgetxattr", "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64",
	"fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64",
	"futex", "futex_time64", "futex_waitv", "futimesat", "getcpu", "getcwd", "getdents", "getdents64",
	"getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32",
	"getitimer", "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
	"getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit", "get_robust_list", "getrusage",
	"getsid", "getsockname", "getsockopt", "get_thread_area", "gettid", "gettimeofday",
	"getuid", "getuid32", "getxattr", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
	"io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "ioprio_get", "ioprio_set",
	"io_setup", "io_submit", "kill", "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
	"lchown", "lchown32", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr", "_llseek",
	"lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise", "membarrier", "memfd_create",
	"mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "mmap2", "mprotect",
	"mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend",
	"mq_timedsend_time64", "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "msync",
	"munlock", "munlockall", "munmap", "nanosleep", "newfstatat", "_newselect", "open", "openat", "openat2",
	"pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "poll", "ppoll", "ppoll_time64", "prctl", "pread64",
	"preadv", "preadv2", "prlimit64", "pselect6", "pselect6_time64", "pwrite64", "pwritev", "pwritev2",
	"read", "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64",
	"recvmsg", "remap_file_pages", "removexattr", "rename", "renameat", "renameat2", "restart_syscall",
	"rmdir", "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
	"rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
	"sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max", "sched_get_priority_min",
	"sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity",
	"sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select",
	"semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64",
	"sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
	"setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
	"setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32", "setrlimit",
	"set_robust_list", "setsid", "setsockopt", "set_thread_area", "set_tid_address", "setuid", "setuid32",
	"setxattr", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4",
	"sigprocmask", "sigreturn", "socketpair", "splice", "stat", "stat64", "statfs",
	"statfs64", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee",
	"tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64",
	"timer_settime", "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64",
	"timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate", "truncate64", "ugetrlimit",
	"umask", "uname", "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64", "utimes", "vfork",
	"wait4", "waitid", "waitpid", "write", "writev",
}

// nsFlags are the clone flags that make namespaces (CLONE_NEWNS,
// NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME).
const nsFlags = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

// SeccompProfile returns the profile for this host's architecture.
func SeccompProfile() *specs.LinuxSeccomp {
	var archs []specs.Arch
	switch runtime.GOARCH {
	case "amd64":
		archs = []specs.Arch{specs.ArchX86_64}
	case "arm64":
		archs = []specs.Arch{specs.ArchAARCH64}
	}
	eperm, enosys := uint(1), uint(38)
	s := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   archs,
		Syscalls: []specs.LinuxSyscall{
			{Names: allowedSyscalls, Action: specs.ActAllow},
			// socket: any family but AF_VSOCK (40), which would reach the
			// host around the network namespace.
			{Names: []string{"socket"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 40, Op: specs.OpNotEqual}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0, Op: specs.OpEqualTo}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, Op: specs.OpEqualTo}}},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	// clone's flags are its first argument on x86 and arm64 alike.
	s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActAllow,
		Args: []specs.LinuxSeccompArg{{Index: 0, Value: nsFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}}})
	return s
}
