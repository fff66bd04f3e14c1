// Package pgproxy is a TCP proxy between a Postgres client and its server,
// for tests that inject database faults (docs/testing.md, "Database
// faults"): cut every connection (and refuse new ones for a while), add
// latency, stall one connection inside a transaction past lock_timeout,
// and the ambiguous commit: forward the Nth commit a client sends to the
// server, let the server commit it, and cut the connection before the
// answer reaches the client, which then cannot know whether it committed;
// and the silent partition: the same commit, after which the connection
// forwards nothing more either way and stays open, as when the server's
// host dies or moves in a failover and no reset ever comes back.
//
// It is written here rather than taken from toxiproxy because the
// ambiguous commit needs to understand the Postgres protocol: toxiproxy's
// toxics see a byte stream and can cut it after a byte count or a time,
// never "after this COMMIT, before its CommandComplete". The proxy
// follows the frontend messages (simple Query, and Parse/Bind/Sync of the
// extended protocol, remembering prepared statements by name because pgx
// caches them) and the backend's ReadyForQuery status, so that it sees a
// commit of a write the way the crash sweep's tracer in internal/pgdb does:
// a COMMIT of a transaction that wrote, a writing statement outside a
// transaction (autocommit), and an implicit-transaction batch (messages up
// to a Sync sent while the server said idle) that writes. The executor's
// hot path commits that way, so a proxy that only looked for the word
// COMMIT would miss most of its commits.
//
// The protocol after the startup message must be in clear: tests connect
// with sslmode=disable (an SSLRequest is forwarded and its one-byte answer
// followed, but an encrypted stream is not parsed).
package pgproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/promptline/promptline/internal/pgdb"
)

// Proxy listens on a local port and forwards each connection to the
// target. Its methods may be called from any goroutine.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu         sync.Mutex
	conns      map[*conn]struct{}
	refusing   bool
	latency    time.Duration
	stallInTx  time.Duration // armed: hold the next unit sent inside a transaction this long
	cutAt      int64         // cut the connection of this commit (1-based); 0: none
	cutBefore  func(label string) bool
	cutAfter   func(label string) bool
	cutWhere   func(stmts []string) bool
	silence    func(label string) bool
	silenceAt  func(stmts []string) bool
	silenceAll bool // silenceAt stays armed after it fired (SilenceEvery)
	commits    int64
	labels     []string
	stats      Stats
	closed     bool
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted      int // connections forwarded
	Refused       int // connections closed at once while refusing
	Cut           int // connections cut by Cut, CutAll or CutOne
	AmbiguousCuts int // connections cut after a commit was sent, before its answer
	CutsBefore    int // connections cut instead of sending a commit
	Stalls        int // units held inside a transaction
	Silenced      int // connections silenced after a commit or a chosen unit was sent
}

// Start listens on 127.0.0.1 and forwards to target (host:port). The
// proxy is closed at the end of the test.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// StartFor is Start for the host and port of a database URL; it returns
// the proxy and the same URL pointing at the proxy.
func StartFor(tb testing.TB, databaseURL string) (*Proxy, string) {
	tb.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		tb.Fatal(err)
	}
	p := Start(tb, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops listening, cuts every connection and waits for the
// forwarding goroutines. It may be called twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if !already {
		_ = p.ln.Close()
	}
	p.CutAll()
	p.wg.Wait()
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Commits returns the commits of writes seen so far, in order, each
// labelled by its first writing statement.
func (p *Proxy) Commits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.labels...)
}

// Refuse makes the proxy close new connections at once (true), or
// forward them again (false).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = on
}

// SetLatency delays every forwarded chunk, in both directions, by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// CutAtCommit arms the ambiguous commit: the nth commit of a write
// (counted from the start of the proxy, 1-based) is forwarded, the
// server's answer is awaited and dropped, and the connection is cut.
func (p *Proxy) CutAtCommit(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAt = int64(n)
}

// CutAfterCommit arms the ambiguous commit for the next commit of a write
// whose label match accepts, as CutAtCommit does for the nth.
func (p *Proxy) CutAfterCommit(match func(label string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter = match
}

// CutAfterCommitWhere arms the ambiguous commit for the next commit of a
// write whose unit's statements (every statement the client sent with the
// commit, in order) match accepts: a combined transaction is told from a
// lone one by what it holds, not by where it falls among the commits.
func (p *Proxy) CutAfterCommitWhere(match func(stmts []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutWhere = match
}

// CutBeforeCommit arms a lost commit: the next commit of a write whose
// label (its first writing statement) match accepts is not sent; its
// connection is cut instead, so the transaction rolls back.
func (p *Proxy) CutBeforeCommit(match func(label string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutBefore = match
}

// SilenceAfterCommit arms a silent partition: the next commit of a write
// whose label match accepts is sent to the server, which commits it, and
// from then on the connection forwards nothing, in either direction (the
// commit's answer included), and stays open: what the client sends is
// read and dropped, so its kernel's writes are acknowledged, as the
// server host's kernel would until it died, and no reset ever comes. The
// client hears nothing until it gives the connection up itself, not even
// that the server ended its side; closing it ends the proxied connection.
func (p *Proxy) SilenceAfterCommit(match func(label string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silence = match
}

// SilenceAt is SilenceAfterCommit for the next message unit, a commit or
// not, whose statements match accepts: a read, a lock wait.
func (p *Proxy) SilenceAt(match func(stmts []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silenceAt, p.silenceAll = match, false
}

// SilenceEvery is SilenceAt for every such unit, on whichever connection,
// until SilenceAt or SilenceEvery arms another: a fault that never heals.
func (p *Proxy) SilenceEvery(match func(stmts []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silenceAt, p.silenceAll = match, true
}

// StallNextInTx arms a stall: the next message unit a client sends while
// its connection is inside a transaction (holding what it locked) is held
// for d, then forwarded.
func (p *Proxy) StallNextInTx(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stallInTx = d
}

// CutAll cuts every open connection and returns how many.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	n := 0
	for _, c := range conns {
		if c.cut() {
			n++
		}
	}
	p.mu.Lock()
	if !p.closed {
		p.stats.Cut += n
	}
	p.mu.Unlock()
	return n
}

// CutOne cuts the open connection pick chooses among n (pick(n) in
// [0, n)) and reports whether there was one.
func (p *Proxy) CutOne(pick func(n int) int) bool {
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	if len(conns) == 0 {
		return false
	}
	if !conns[pick(len(conns))].cut() {
		return false
	}
	p.mu.Lock()
	p.stats.Cut++
	p.mu.Unlock()
	return true
}

// UpstreamPorts returns the local ports of the proxy's connections to the
// server: pg_stat_activity.client_port of the backends serving the
// proxied clients.
func (p *Proxy) UpstreamPorts() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ports []int
	for c := range p.conns {
		if a, ok := c.server.LocalAddr().(*net.TCPAddr); ok {
			ports = append(ports, a.Port)
		}
	}
	return ports
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refusing, closed := p.refusing, p.closed
		if refusing {
			p.stats.Refused++
		}
		p.mu.Unlock()
		if refusing || closed {
			_ = client.Close()
			continue
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &conn{p: p, client: client, server: server, stmts: map[string]string{}, answered: make(chan struct{})}
		c.status.Store('I')
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.cut()
			continue
		}
		p.conns[c] = struct{}{}
		p.stats.Accepted++
		p.mu.Unlock()
		p.wg.Add(2)
		go c.fromClient()
		go c.fromServer()
	}
}

// delay waits for the latency in force.
func (p *Proxy) delay() {
	p.mu.Lock()
	d := p.latency
	p.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

// conn is one proxied connection.
type conn struct {
	p              *Proxy
	client, server net.Conn
	once           sync.Once
	cutDone        atomic.Bool

	status    atomic.Int32 // the last ReadyForQuery status: 'I', 'T' or 'E'
	sslReply  atomic.Int32 // one-byte answers the server owes (SSLRequest, GSSENCRequest)
	drop      atomic.Bool  // discard the server's messages: the ambiguous commit's answer
	silent    atomic.Bool  // forward nothing more, either way, and keep the connection open
	answered  chan struct{}
	answerOne sync.Once

	// Read and written by fromClient only.
	stmts map[string]string // prepared statement name -> SQL
	wrote string            // the first writing statement of the open transaction
}

// cut closes both sides; it reports whether this call did.
func (c *conn) cut() bool {
	did := false
	c.once.Do(func() {
		did = true
		c.cutDone.Store(true)
		_ = c.client.Close()
		_ = c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
	return did
}

const (
	sslRequest    = 80877103
	gssencRequest = 80877104
	cancelRequest = 80877102
)

// fromClient forwards the client's messages a unit at a time (up to a
// Sync, a simple Query, a Flush or a Terminate), so that a unit that
// commits reaches the server whole after the proxy decided what to do with
// its answer.
func (c *conn) fromClient() {
	defer c.p.wg.Done()
	defer c.cut()
	r := bufio.NewReaderSize(c.client, 64<<10)
	// Startup: untyped packets until the startup message proper.
	for {
		pkt, err := readUntyped(r)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(pkt[4:8])
		if code == sslRequest || code == gssencRequest {
			c.sslReply.Add(1)
		}
		if _, err := c.server.Write(pkt); err != nil {
			return
		}
		if code == cancelRequest {
			_, _ = io.Copy(c.server, r)
			return
		}
		if code != sslRequest && code != gssencRequest {
			break
		}
	}
	var unit []byte
	var bound []string // the statements bound (executed) in this unit
	for {
		typ, msg, err := readTyped(r)
		if err != nil {
			return
		}
		if c.silent.Load() {
			continue // the partition: read, acknowledged by this kernel, never forwarded
		}
		unit = append(unit, msg...)
		body := msg[5:]
		switch typ {
		case 'P':
			name, rest := cstring(body)
			query, _ := cstring(rest)
			c.stmts[name] = query
			continue
		case 'B':
			_, rest := cstring(body)
			name, _ := cstring(rest)
			bound = append(bound, c.stmts[name])
			continue
		case 'Q':
			query, _ := cstring(body)
			bound = append(bound, splitStatements(query)...)
		case 'S':
		case 'H', 'X':
			if err := c.forward(unit, "", nil); err != nil || typ == 'X' {
				return
			}
			unit = unit[:0]
			continue
		default:
			continue
		}
		label := c.commitOf(bound)
		if err := c.forward(unit, label, bound); err != nil {
			return
		}
		unit, bound = unit[:0], bound[:0]
	}
}

// commitOf follows the transaction through a unit's statements and
// returns the label of the commit of a write the unit makes, "" for none.
func (c *conn) commitOf(stmts []string) string {
	open := c.status.Load() != 'I'
	implicit := ""
	commit := ""
	for _, s := range stmts {
		sql := strings.ToLower(strings.TrimSpace(s))
		switch {
		case strings.HasPrefix(sql, "begin") || strings.HasPrefix(sql, "start transaction"):
			open, c.wrote = true, ""
		case sql == "commit" || sql == "end" || strings.HasPrefix(sql, "commit "):
			if open && c.wrote != "" && commit == "" {
				commit = c.wrote
			}
			open, c.wrote = false, ""
		case strings.HasPrefix(sql, "rollback"):
			open, c.wrote = false, ""
		case pgdb.Writes(sql):
			if open {
				c.wrote = pgdb.CommitLabel(c.wrote, s)
			} else {
				implicit = pgdb.CommitLabel(implicit, s)
			}
		}
	}
	if commit == "" && !open {
		commit = implicit
	}
	if open && implicit != "" {
		c.wrote = pgdb.CommitLabel(c.wrote, implicit)
	}
	return commit
}

// forward sends a unit to the server; label names the commit it makes,
// stmts are the statements it binds.
func (c *conn) forward(unit []byte, label string, stmts []string) error {
	p := c.p
	cutHere, lose, silence := false, false, false
	var stall time.Duration
	p.mu.Lock()
	if label != "" && p.cutBefore != nil && p.cutBefore(label) {
		p.cutBefore, lose = nil, true
		p.stats.CutsBefore++
	}
	if label != "" {
		p.commits++
		p.labels = append(p.labels, oneLine(label))
		at := p.commits == p.cutAt
		after := !at && !lose && p.cutAfter != nil && p.cutAfter(label)
		where := !at && !after && !lose && p.cutWhere != nil && p.cutWhere(stmts)
		if after {
			p.cutAfter = nil
		}
		if where {
			p.cutWhere = nil
		}
		if at || after || where {
			cutHere = true
			p.stats.AmbiguousCuts++
		}
		if !at && !after && !where && !lose && p.silence != nil && p.silence(label) {
			p.silence, silence = nil, true
			p.stats.Silenced++
		}
	}
	if !cutHere && !lose && !silence && p.silenceAt != nil && p.silenceAt(stmts) {
		if !p.silenceAll {
			p.silenceAt = nil
		}
		silence = true
		p.stats.Silenced++
	}
	if p.stallInTx > 0 && c.status.Load() == 'T' && !cutHere && !silence {
		stall, p.stallInTx = p.stallInTx, 0
		p.stats.Stalls++
	}
	p.mu.Unlock()
	if lose {
		c.cut()
		return errors.New("commit lost: cut")
	}
	if stall > 0 {
		time.Sleep(stall) // the stall itself: the backend sits in its transaction
	}
	p.delay()
	if cutHere {
		c.drop.Store(true)
	}
	if silence {
		c.silent.Store(true) // before the write: not a byte of the answer gets through
	}
	if _, err := c.server.Write(unit); err != nil {
		return err
	}
	if cutHere {
		// The server commits and answers; the answer is dropped, then the
		// connection is cut: durable, and the client never learns it.
		select {
		case <-c.answered:
		case <-time.After(5 * time.Second):
		}
		c.cut()
		return errors.New("ambiguous commit: cut")
	}
	return nil
}

// fromServer forwards the server's messages, following ReadyForQuery.
func (c *conn) fromServer() {
	defer c.p.wg.Done()
	defer func() {
		// A silenced connection's client never hears that the server
		// closed its end (the partition): fromClient cuts it when the
		// client gives up, or Close does.
		if !c.silent.Load() {
			c.cut()
		}
	}()
	r := bufio.NewReaderSize(c.server, 64<<10)
	w := bufio.NewWriterSize(c.client, 64<<10)
	for {
		if c.sslReply.Load() > 0 {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			c.sslReply.Add(-1)
			c.p.delay()
			if _, err := c.client.Write([]byte{b}); err != nil {
				return
			}
			continue
		}
		typ, msg, err := readTyped(r)
		if err != nil {
			return
		}
		if typ == 'Z' && len(msg) > 5 {
			c.status.Store(int32(msg[5]))
		}
		if c.silent.Load() {
			continue
		}
		if c.drop.Load() {
			if typ == 'Z' {
				c.answerOne.Do(func() { close(c.answered) })
			}
			continue
		}
		if _, err := w.Write(msg); err != nil {
			return
		}
		if r.Buffered() == 0 || typ == 'Z' {
			c.p.delay()
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// readUntyped reads a startup-phase packet: int32 length, then the rest.
func readUntyped(r *bufio.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > 1<<20 {
		return nil, errors.New("bad startup packet length")
	}
	pkt := make([]byte, n)
	copy(pkt, hdr[:])
	_, err := io.ReadFull(r, pkt[4:])
	return pkt, err
}

// readTyped reads a message: type byte, int32 length (itself included),
// body; it returns the whole message.
func readTyped(r *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 1<<30 {
		return 0, nil, errors.New("bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[5:])
	return hdr[0], msg, err
}

func cstring(b []byte) (string, []byte) {
	for i, x := range b {
		if x == 0 {
			return string(b[:i]), b[i+1:]
		}
	}
	return string(b), nil
}

// splitStatements splits a simple query on semicolons outside quotes.
func splitStatements(q string) []string {
	var out []string
	var quote rune
	start := 0
	for i, r := range q {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == ';':
			out = append(out, q[start:i])
			start = i + 1
		}
	}
	if strings.TrimSpace(q[start:]) != "" {
		out = append(out, q[start:])
	}
	return out
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}
