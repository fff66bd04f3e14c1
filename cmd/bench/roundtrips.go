package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Message codes of the PostgreSQL protocol that open no typed message
// stream (the client then waits for a one-byte answer or TLS).
const (
	pgSSLRequest    = 80877103
	pgGSSENCRequest = 80877104
)

var errTLSThroughCounter = errors.New("a client asked for TLS through the round-trip counter (use sslmode=disable)")

// tripCounter is a TCP proxy between a consumer process and Postgres that
// counts round trips: every Sync ('S', the end of an extended-protocol
// exchange, one per pgx batch) and every simple Query ('Q') the clients
// send is one request the client then waits on. A client that asks for
// TLS through it is refused (the proxy reads plain protocol only).
type tripCounter struct {
	ln     net.Listener
	target string
	trips  atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	err    error
}

// newTripCounter listens on a loopback port and forwards to the scratch
// server, which must speak plain TCP (no TLS) for the count to be read.
func newTripCounter(sc *scratchServer) (*tripCounter, error) {
	if sc.admin.TLSConfig != nil || strings.HasPrefix(sc.admin.Host, "/") {
		return nil, errors.New("round trips are counted on a plain TCP connection to the server only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &tripCounter{ln: ln, target: net.JoinHostPort(sc.admin.Host, strconv.Itoa(int(sc.admin.Port)))}
	t.wg.Go(t.accept)
	return t, nil
}

// port is the proxy's port, to put in a database URL.
func (t *tripCounter) port() int { return t.ln.Addr().(*net.TCPAddr).Port }

func (t *tripCounter) accept() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", t.target)
		if err != nil {
			c.Close()
			t.fail(err)
			continue
		}
		t.mu.Lock()
		t.conns = append(t.conns, c, s)
		t.mu.Unlock()
		t.wg.Go(func() {
			_, _ = io.Copy(c, s)
			c.Close()
		})
		t.wg.Go(func() {
			// A connection's end (EOF, a reset, the proxy closing) ends
			// the copy; only a client the count cannot read is an error.
			if err := t.forward(s, c); errors.Is(err, errTLSThroughCounter) {
				t.fail(err)
			}
			s.Close()
		})
	}
}

func (t *tripCounter) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.err = cmpErr(t.err, err)
}

// forward copies the client's messages to the server until either side
// ends (it returns only with an error), counting Syncs and
// simple Queries; it flushes whenever nothing more has arrived, so that
// the client's batching reaches the server as it was sent.
func (t *tripCounter) forward(dst io.Writer, src io.Reader) error {
	r, w := bufio.NewReaderSize(src, 64<<10), bufio.NewWriterSize(dst, 64<<10)
	var head [8]byte
	// The startup message: length and protocol code, no type byte.
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return err
	}
	if code := binary.BigEndian.Uint32(head[4:]); code == pgSSLRequest || code == pgGSSENCRequest {
		return errTLSThroughCounter
	}
	n := int64(binary.BigEndian.Uint32(head[:4])) - 8
	if _, err := w.Write(head[:]); err != nil {
		return err
	}
	if _, err := io.CopyN(w, r, n); err != nil {
		return err
	}
	for {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
		if _, err := io.ReadFull(r, head[:5]); err != nil {
			return err
		}
		if head[0] == 'S' || head[0] == 'Q' {
			t.trips.Add(1)
		}
		if _, err := w.Write(head[:5]); err != nil {
			return err
		}
		if _, err := io.CopyN(w, r, int64(binary.BigEndian.Uint32(head[1:5]))-4); err != nil {
			return err
		}
	}
}

// close stops the proxy and its connections and returns the first
// forwarding error.
func (t *tripCounter) close() error {
	t.ln.Close()
	t.mu.Lock()
	for _, c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}
