//go:build unix

package terminal

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// killSession kills, with SIGKILL, the process group sid and every process
// /proc shows in session sid (on Linux; a system without /proc gets the
// group alone). An interactive shell puts each job in a group of its own,
// so the group alone would leave its background jobs running. It scans
// again while it finds some, at most a few times, to catch a fork that
// raced the kill.
func killSession(sid int) {
	if sid <= 1 {
		return
	}
	_ = syscall.Kill(-sid, syscall.SIGKILL)
	for range 5 {
		if killed := killInSession(sid); killed == 0 {
			return
		}
	}
}

// killInSession sends SIGKILL to each live process /proc shows in session
// sid and returns how many it signalled.
func killInSession(sid int) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	killed := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		if s, ok := sessionOf(pid); ok && s == sid {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	return killed
}

// sessionOf reads a live (not zombie) process's session id from
// /proc/PID/stat: after the command name's closing ')' come state, ppid,
// pgrp and session.
func sessionOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 || string(f[0]) == "Z" {
		return 0, false
	}
	s, err := strconv.Atoi(string(f[3]))
	return s, err == nil
}

// groupAttr puts a command in a process group of its own.
func groupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killGroup kills process group pgid with SIGKILL.
func killGroup(pgid int) {
	if pgid > 1 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}
