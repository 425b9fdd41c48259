package hostinstall

// The installed paths, relative to the root the install writes under.
const (
	BinPath         = "/usr/local/bin/bcd"
	UnitDir         = "/etc/systemd/system"
	NodeUnitPath    = UnitDir + "/bcd.service"
	HelperUnitPath  = UnitDir + "/bcd-helper.service"
	ConfigDir       = "/etc/bcd"
	ConfigPath      = ConfigDir + "/helper.toml"
	NodeDataDir     = "/var/lib/bcd"
	HelperStateDir  = "/var/lib/bcd-helper"
	HelperRunDir    = "/run/bcd-helper"
	HelperSocket    = HelperRunDir + "/helper.sock"
	NodeUser        = "bcd"
	nologinShell    = "/usr/sbin/nologin"
	nonexistentHome = "/nonexistent"
)

// NodeUnit is bcd.service: bcd node as the bcd account, with no
// capability at all and the kernel surface narrowed to what a network
// client that keeps files in /var/lib/bcd needs. Whatever needs root goes
// through the helper's socket.
const NodeUnit = `# bcd.service: the Better Compute node agent, unprivileged.
# Written by bcd install --unprivileged; bcd doctor checks these lines.
[Unit]
Description=Better Compute node agent (unprivileged)
Wants=network-online.target
After=network-online.target bcd-helper.service
Requires=bcd-helper.service

[Service]
Type=simple
ExecStart=` + BinPath + ` node --helper-socket ` + HelperSocket + ` --data ` + NodeDataDir + `
User=bcd
Group=bcd
StateDirectory=bcd
StateDirectoryMode=0700
UMask=0077
Restart=on-failure
RestartSec=5s
# No capability: bounding and ambient sets empty, no way to gain one.
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
RestrictSUIDSGID=yes
# The file system: read-only but for the node's own state.
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ReadWritePaths=` + NodeDataDir + `
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
# The kernel surface: the helper's socket and the gateway, nothing else.
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallFilter=@system-service
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
`

// HelperUnit is bcd-helper.service: the root helper. Its capability
// bounding set was checked on the project's machine by running runc and
// runsc containers (the sandboxes' spec: no capabilities, no new
// privileges) under setpriv --no-new-privs --bounding-set with exactly this
// set. It sets no mount-namespace option (ProtectSystem, PrivateTmp,
// ProtectHome, ProtectKernel*, ReadWritePaths): runc's mounts and the
// sandboxes' network namespace files must be in the host's mount
// namespace, and a restarted helper must find the containers it started.
const HelperUnit = `# bcd-helper.service: the Better Compute root helper. It serves typed
# operations to bcd node on ` + HelperSocket + ` and checks each itself.
# Written by bcd install --unprivileged; bcd doctor checks these lines.
[Unit]
Description=Better Compute root helper
Before=bcd.service

[Service]
Type=simple
ExecStart=` + BinPath + ` helper --config ` + ConfigPath + `
# The socket's directory: root's, 0755; the socket inside is 0660 root:bcd.
RuntimeDirectory=bcd-helper
RuntimeDirectoryMode=0755
StateDirectory=bcd-helper
StateDirectoryMode=0700
UMask=0077
Restart=on-failure
RestartSec=5s
# runc, runsc and nft run as root but gain nothing by exec: checked with
# runc and runsc under no_new_privs (the sandboxes set it themselves).
NoNewPrivileges=yes
AmbientCapabilities=
# Each capability is for a named need; none else survives:
#  CAP_SYS_ADMIN     runc/runsc: mount, pivot_root, namespaces, cgroups
#  CAP_NET_ADMIN     nft rulesets in bcd's tables; veth and netns set-up
#  CAP_SETUID        runc/runsc: switch to the sandbox's user
#  CAP_SETGID        runc/runsc: the sandbox's groups; the socket's group
#  CAP_CHOWN         the socket to root:bcd; runc chowns the sandbox's /dev
#  CAP_DAC_OVERRIDE  runc/runsc: image files of other owners in a rootfs
#  CAP_FOWNER        runc: chmod and utimes on rootfs files of other owners
#  CAP_KILL          sandbox.delete signals processes of the sandbox's user
#  CAP_SYS_BOOT      host.reboot
#  CAP_SYS_CHROOT    runc/runsc: chroot into the sandbox's root
#  CAP_MKNOD         runc: device nodes in the sandbox's /dev
#  CAP_SYS_PTRACE    /proc/<pid>/exe of the caller (uid bcd) is a ptrace
#                    read check; runc exec joins /proc/<pid>/ns of others
# Left out: CAP_NET_RAW (sandboxes get no capability, nft needs none),
# CAP_SETPCAP (runc ran without it), CAP_SYS_MODULE, CAP_SYS_RAWIO,
# CAP_SYS_TIME, CAP_BPF, CAP_SYS_RESOURCE (the sandbox's rlimits are
# set inside it, not by runc).
CapabilityBoundingSet=CAP_SYS_ADMIN CAP_NET_ADMIN CAP_SETUID CAP_SETGID CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_KILL CAP_SYS_BOOT CAP_SYS_CHROOT CAP_MKNOD CAP_SYS_PTRACE
LockPersonality=yes
RestrictRealtime=yes
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
`

// requiredLine is one setting a unit must carry with exactly this value,
// in every place it is set (the main file and every drop-in), since
// systemd adds up some settings (CapabilityBoundingSet) and lets later
// ones override others.
type requiredLine struct{ Key, Value string }

// nodeRequired are the lines bcd doctor requires of bcd.service.
func nodeRequired() []requiredLine {
	return []requiredLine{
		{"User", "bcd"}, {"Group", "bcd"}, {"NoNewPrivileges", "yes"},
		{"CapabilityBoundingSet", ""}, {"AmbientCapabilities", ""},
		{"ProtectSystem", "strict"}, {"ProtectHome", "yes"}, {"PrivateTmp", "yes"},
		{"PrivateDevices", "yes"}, {"ReadWritePaths", NodeDataDir},
		{"ProtectKernelTunables", "yes"}, {"ProtectKernelModules", "yes"}, {"ProtectKernelLogs", "yes"},
		{"ProtectControlGroups", "yes"}, {"RestrictNamespaces", "yes"}, {"RestrictSUIDSGID", "yes"},
		{"LockPersonality", "yes"}, {"MemoryDenyWriteExecute", "yes"},
		{"RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"},
		{"SystemCallFilter", "@system-service"}, {"SystemCallArchitectures", "native"},
		{"UMask", "0077"}, {"StateDirectoryMode", "0700"},
	}
}

// nodeForbidden are settings bcd.service must not carry at all: a
// supplementary group would hand the node another group's files or
// devices, and PermissionsStartOnly/'+' prefixes would run as root.
func nodeForbidden() []string {
	return []string{"SupplementaryGroups", "DynamicUser", "PermissionsStartOnly"}
}

// helperRequired are the lines bcd doctor requires of bcd-helper.service.
func helperRequired() []requiredLine {
	return []requiredLine{
		{"NoNewPrivileges", "yes"}, {"AmbientCapabilities", ""},
		{"RuntimeDirectory", "bcd-helper"}, {"RuntimeDirectoryMode", "0755"},
		{"StateDirectoryMode", "0700"},
		{"CapabilityBoundingSet", "CAP_SYS_ADMIN CAP_NET_ADMIN CAP_SETUID CAP_SETGID CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_KILL CAP_SYS_BOOT CAP_SYS_CHROOT CAP_MKNOD CAP_SYS_PTRACE"},
	}
}
