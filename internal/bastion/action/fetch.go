package action

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// fetchInputs fetches every input into dir (as dir/<As>, 0444) through
// the guard and returns every host reached, redirects included, in order.
func (r *Runner) fetchInputs(ctx context.Context, dir string, inputs []Input) ([]string, error) {
	hosts := &hostLog{}
	client := r.guard.client(hosts)
	defer client.CloseIdleConnections()
	for i, in := range inputs {
		host, err := inputHost(in.URL)
		if err != nil {
			return nil, refuse(ReasonBadInput, fmt.Sprintf("input %d: %v", i, err))
		}
		hosts.add(host)
		if err := fetchOne(ctx, client, in, filepath.Join(dir, in.As)); err != nil {
			return nil, fmt.Errorf("action: input %d: %w", i, err)
		}
	}
	return hosts.hosts, nil
}

// fetchOne GETs in.URL into dst, refusing a status other than 200 and a
// body over MaxInputBytes.
func fetchOne(ctx context.Context, client *http.Client, in Input, dst string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.URL, nil)
	if err != nil {
		return refuse(ReasonBadInput, "the URL cannot be requested")
	}
	resp, err := client.Do(req)
	if err != nil {
		var re *RefusedError
		var ne *netguard.RefusedError
		switch {
		case errors.As(err, &re):
			return re
		case errors.As(err, &ne):
			return refuse(ReasonDestinationPrivate, ne.Target+" ("+ne.Reason.String()+")")
		}
		return refuse(ReasonInputFetch, in.As+": "+fetchWhy(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refuse(ReasonInputFetch, in.As+": status "+strconv.Itoa(resp.StatusCode))
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("action: input file: %w", err)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, MaxInputBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return refuse(ReasonInputFetch, in.As+": "+fetchWhy(err))
	case n > MaxInputBytes:
		return refuse(ReasonInputTooLarge, fmt.Sprintf("%s: over %d bytes", in.As, MaxInputBytes))
	}
	return nil
}

// fetchWhy names a fetch failure in safe words: a generic cause, never an
// address or the server's text.
func fetchWhy(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case strings.Contains(err.Error(), "redirect"):
		return "redirect refused"
	}
	return "no answer"
}
