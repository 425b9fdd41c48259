package bastions

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// maxAnswerHead bounds an answer's status line and headers.
const maxAnswerHead = 64 << 10

// exchange is one request to a bastion's ops server and the head of its
// answer, under OpTimeout.
type exchange struct {
	conn   net.Conn
	lim    *limitedReader
	br     *bufio.Reader
	resp   *http.Response
	disarm func() bool // ends the timeout; false when it already fired
}

// exchange dials the bastion's ops server, sends req and reads the
// answer's head, all before OpTimeout passes on the module's clock (or
// ctx ends): then the connection's deadline is set in the past, which
// ends any read or write at once. A dial failure keeps its code (no
// tunnel: INVALID_STATE; no answer: UNAVAILABLE); anything after it is
// errNoAnswer.
func (s *Service) exchange(ctx context.Context, d OpsDialer, bastionID string, req *http.Request) (*exchange, error) {
	ctx, cancel := context.WithCancel(ctx)
	timer := s.clk.NewTimer(OpTimeout)
	go func() {
		select {
		case <-timer.C():
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := d.DialOps(ctx, bastionID)
	if err != nil {
		timer.Stop()
		cancel()
		var ce *errs.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, errs.Wrap(errs.Unavailable, "the bastion's ops server did not answer", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	ex := &exchange{conn: conn, lim: &limitedReader{r: conn, left: maxAnswerHead}}
	ex.disarm = func() bool {
		ok := stop()
		timer.Stop()
		cancel()
		return ok
	}
	ex.br = bufio.NewReader(ex.lim)
	if err := req.Write(conn); err != nil {
		ex.close()
		return nil, errNoAnswer
	}
	if ex.resp, err = http.ReadResponse(ex.br, req); err != nil {
		ex.close()
		return nil, errNoAnswer
	}
	return ex, nil
}

// body reads the answer's body, at most limit bytes (a longer one is an
// error).
func (ex *exchange) body(limit int64) ([]byte, error) {
	ex.lim.setLeft(limit + 1)
	raw, err := io.ReadAll(io.LimitReader(ex.resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, errors.New("bastions: answer over its limit")
	}
	return raw, nil
}

// close ends the timeout and the connection.
func (ex *exchange) close() {
	ex.disarm()
	_ = ex.conn.Close()
}

// upgraded ends the timeout and returns the connection after a 101
// answer, reading first what the answer's reader holds; nil when the
// timeout already fired.
func (ex *exchange) upgraded() net.Conn {
	if !ex.disarm() {
		_ = ex.conn.Close()
		return nil
	}
	_ = ex.conn.SetDeadline(time.Time{})
	ex.lim.setLeft(-1)
	return &bufferedConn{Conn: ex.conn, r: ex.br}
}

// limitedReader reads at most left bytes from r (left < 0: no limit).
type limitedReader struct {
	mu   sync.Mutex
	r    io.Reader
	left int64
}

func (l *limitedReader) setLeft(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.left = n
}

func (l *limitedReader) Read(p []byte) (int, error) {
	l.mu.Lock()
	left := l.left
	l.mu.Unlock()
	if left == 0 {
		return 0, errors.New("bastions: the bastion's answer is over its limit")
	}
	if left > 0 && int64(len(p)) > left {
		p = p[:left]
	}
	n, err := l.r.Read(p)
	if left > 0 {
		l.mu.Lock()
		l.left -= int64(n)
		l.mu.Unlock()
	}
	return n, err
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection when it can.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
