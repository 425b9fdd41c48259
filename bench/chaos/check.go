package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// jcmd is what a node's journal says of one command.
type jcmd struct {
	// starts is the most "start" entries for the id in one journal file.
	// A file holds one per run: the compaction at a restart rewrites a
	// started command as one entry, and every later start is appended,
	// so two in one file mean the command began twice.
	starts int
	done   bool
	state  string // from the signed update of the last "done"
	reason string
}

// journalEntry is one line of bcd's journal (internal/daemon/journal).
type journalEntry struct {
	Op     string `json:"op"`
	ID     string `json:"id"`
	Update []byte `json:"update"`
}

// readJournal parses one journal file into per-command facts. A torn or
// half-written last line is skipped, as bcd's own loader does.
func readJournal(path string) (map[string]*jcmd, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]*jcmd{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	out := map[string]*jcmd{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var e journalEntry
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		j := out[e.ID]
		if j == nil {
			j = &jcmd{}
			out[e.ID] = j
		}
		switch e.Op {
		case "start":
			j.starts++
		case "done":
			var u nodev1.CommandUpdate
			var body nodev1.UpdateBody
			if err := proto.Unmarshal(e.Update, &u); err != nil {
				return nil, fmt.Errorf("journal %s: update of %s: %w", path, e.ID, err)
			}
			if err := proto.Unmarshal(u.Body, &body); err != nil {
				return nil, fmt.Errorf("journal %s: update body of %s: %w", path, e.ID, err)
			}
			j.done, j.state, j.reason = true, body.State, body.Reason
		}
	}
	return out, sc.Err()
}

// journals merges, for each node, its saved journal copies (cached once
// read) and its live journal: starts is the most in any one file, the
// final update the newest file's.
type journals struct {
	cache map[string]map[string]*jcmd // saved copy path -> parsed
}

func (js *journals) node(n *node) (map[string]*jcmd, error) {
	if js.cache == nil {
		js.cache = map[string]map[string]*jcmd{}
	}
	merged := map[string]*jcmd{}
	files := append(append([]string(nil), n.segments...), filepath.Join(n.dataDir, "journal.log"))
	for i, f := range files {
		m, ok := js.cache[f]
		if !ok {
			var err error
			if m, err = readJournal(f); err != nil {
				return nil, err
			}
			if i < len(files)-1 {
				js.cache[f] = m
			}
		}
		for id, j := range m {
			g := merged[id]
			if g == nil {
				g = &jcmd{}
				merged[id] = g
			}
			g.starts = max(g.starts, j.starts)
			if j.done {
				g.done, g.state, g.reason = true, j.state, j.reason
			}
		}
	}
	return merged, nil
}

// dbCmd is a command as the control plane's database holds it.
type dbCmd struct {
	id, nodeID, state, reason string
	late                      bool
}

func (c *cluster) commandStates(ctx context.Context, ids []string) (map[string]dbCmd, error) {
	out := map[string]dbCmd{}
	for start := 0; start < len(ids); start += 500 {
		part := ids[start:min(start+500, len(ids))]
		args := make([]any, len(part))
		marks := make([]string, len(part))
		for i, id := range part {
			args[i], marks[i] = id, fmt.Sprintf("$%d", i+1)
		}
		rows, err := c.db.QueryContext(ctx, `SELECT id, node_id, state, reason, late FROM commands WHERE id IN (`+strings.Join(marks, ",")+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var d dbCmd
			var late int
			if err := rows.Scan(&d.id, &d.nodeID, &d.state, &d.reason, &late); err != nil {
				rows.Close()
				return nil, err
			}
			d.late = late != 0
			out[d.id] = d
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func isFinal(state string) bool {
	return state == "succeeded" || state == "failed" || state == "cancelled"
}

// defect is one command the checks found wrong.
type defect struct {
	Fault   string `json:"fault"`
	Round   int    `json:"round"`
	What    string `json:"what"` // lost, run-twice, state-differs
	Command string `json:"command"`
	Node    string `json:"node"`
	DB      string `json:"db"`
	Journal string `json:"journal"`
}

// check compares the round's commands in the database with every node's
// journal.
func (c *cluster) check(ctx context.Context, js *journals, fault string, round int, ids []string) (lost, twice, differs int, defects []defect, err error) {
	st, err := c.commandStates(ctx, ids)
	if err != nil {
		return 0, 0, 0, nil, err
	}
	byID := map[string]*node{}
	jn := map[string]map[string]*jcmd{}
	for _, n := range c.nodes {
		byID[n.id] = n
		if jn[n.id], err = js.node(n); err != nil {
			return 0, 0, 0, nil, err
		}
	}
	for _, id := range ids {
		d, ok := st[id]
		if !ok {
			lost++
			defects = append(defects, defect{Fault: fault, Round: round, What: "lost", Command: id, DB: "missing"})
			continue
		}
		name := d.nodeID
		if n := byID[d.nodeID]; n != nil {
			name = n.name
		}
		j := jn[d.nodeID][id]
		dbs := d.state
		if d.reason != "" {
			dbs += " (" + d.reason + ")"
		}
		if d.late {
			dbs += " late"
		}
		js := "absent"
		if j != nil {
			js = fmt.Sprintf("starts=%d", j.starts)
			if j.done {
				js += " done=" + j.state
				if j.reason != "" {
					js += " (" + j.reason + ")"
				}
			}
		}
		add := func(what string) {
			defects = append(defects, defect{Fault: fault, Round: round, What: what, Command: id, Node: name, DB: dbs, Journal: js})
		}
		// A command is delivered when it ends succeeded or failed; one
		// still open after the wait, or cancelled (it expired
		// undelivered), is lost.
		if d.state != "succeeded" && d.state != "failed" {
			lost++
			add("lost")
		}
		if j != nil && j.starts > 1 {
			twice++
			add("run-twice")
		}
		if isFinal(d.state) && j != nil && j.done && j.state != d.state {
			differs++
			add("state-differs")
		} else if (d.state == "succeeded" || d.state == "failed") && (j == nil || !j.done) {
			differs++
			add("state-differs")
		}
	}
	return lost, twice, differs, defects, nil
}
