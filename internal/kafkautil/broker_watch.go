package kafkautil

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/startstop"
)

// BrokerWatch cuts a stopped broker out of every Sarama client that dials
// through it (Apply), and tells when a broker has left a request
// unanswered for long (Hung).
//
// A broker that is stopped, not dead (SIGSTOP, a frozen VM, a full GC
// pause that never ends), keeps its TCP connections open: a request
// already sent to it gets neither an answer nor an error until the
// client's Net.ReadTimeout, which a consumer group's client must keep
// above the rebalance timeout (65s, GroupConfig) for its JoinGroup; and
// each client only looks for new leaders after that error. Meanwhile the
// controller fences the broker after broker.session.timeout.ms (9s by
// default) and moves its leaderships: the cluster serves those partitions
// again, the clients do not. The watch asks the cluster for its metadata
// every Interval (a client of its own, short read timeout); a broker that
// it named before and no longer names is fenced: every connection to its
// address is closed at once, and dials to it fail until the metadata
// names it again. The clients' requests to it then fail, their metadata
// refresh skips it, and they go to the new leaders and coordinator within
// about one Interval of the failover.
type BrokerWatch struct {
	seeds  []string
	topics []string
	probe  *sarama.Config
	dialer net.Dialer
	config BrokerWatchConfig

	mu     sync.Mutex
	conns  map[string]map[*watchedConn]struct{}
	known  map[string]bool
	fenced map[string]bool
	// answered is when each broker last answered the watch's own probe
	// (probe); probing says whether a probe to it is in flight.
	answered map[string]time.Time
	probing  map[string]bool
	probes   map[string]*sarama.Broker // read and written by run's probes

	loop startstop.Loop
	wg   sync.WaitGroup // the probes in flight
}

// BrokerWatchConfig configures a BrokerWatch.
type BrokerWatchConfig struct {
	// Topics are asked for in each metadata request (Kafka has no request
	// for the brokers alone that Sarama sends). Defaults to none: the
	// metadata of every topic.
	Topics []string
	// Interval is how often the cluster's metadata is read. Defaults to 1s.
	Interval time.Duration
	// HungAfter is how long a connection may wait for the answer to a
	// request before Hung reports it. Defaults to 5s.
	HungAfter time.Duration
	// Logger receives the brokers fenced and back (Warn, Info). Defaults
	// to discarding.
	Logger *slog.Logger
}

// probeReadTimeout bounds the watch's own metadata requests: one sent to
// the stopped broker costs this long before the next broker is asked.
const probeReadTimeout = 3 * time.Second

// NewBrokerWatch returns a watch of the cluster behind brokers; base is the
// clients' configuration (TLS, SASL, dial settings), not changed.
func NewBrokerWatch(brokers []string, base *sarama.Config, config *BrokerWatchConfig) *BrokerWatch {
	config = cmp.Or(config, &BrokerWatchConfig{})
	w := &BrokerWatch{
		seeds:  slices.Clone(brokers),
		topics: slices.Clone(config.Topics),
		dialer: net.Dialer{Timeout: base.Net.DialTimeout, KeepAlive: base.Net.KeepAlive, LocalAddr: base.Net.LocalAddr},
		config: *config,
		conns:  map[string]map[*watchedConn]struct{}{},
		known:  map[string]bool{},
		fenced: map[string]bool{},

		answered: map[string]time.Time{},
		probing:  map[string]bool{},
		probes:   map[string]*sarama.Broker{},
	}
	w.config.Interval = cmp.Or(w.config.Interval, time.Second)
	w.config.HungAfter = cmp.Or(w.config.HungAfter, 5*time.Second)
	if w.config.Logger == nil {
		w.config.Logger = slog.New(slog.DiscardHandler)
	}
	probe := *base
	probe.ClientID = base.ClientID + "-watch"
	probe.Net.ReadTimeout = probeReadTimeout
	probe.Metadata.Full = false
	probe.Metadata.RefreshFrequency = 0
	probe.Metadata.Retry.Max = 0
	w.Apply(&probe)
	w.probe = &probe
	return w
}

// Apply makes the clients built from c dial through the watch.
func (w *BrokerWatch) Apply(c *sarama.Config) {
	c.Net.Proxy.Enable = true
	c.Net.Proxy.Dialer = w
}

// Dial connects to a broker, unless the cluster has fenced it.
func (w *BrokerWatch) Dial(network, addr string) (net.Conn, error) {
	w.mu.Lock()
	fenced := w.fenced[addr]
	w.mu.Unlock()
	if fenced {
		return nil, fmt.Errorf("broker %s is fenced (absent from the cluster's metadata): not connecting", addr)
	}
	conn, err := w.dialer.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	wc := &watchedConn{Conn: conn, addr: addr, watch: w}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fenced[addr] {
		_ = conn.Close()
		return nil, fmt.Errorf("broker %s is fenced (absent from the cluster's metadata): not connecting", addr)
	}
	if w.conns[addr] == nil {
		w.conns[addr] = map[*watchedConn]struct{}{}
	}
	w.conns[addr][wc] = struct{}{}
	return wc, nil
}

// Start begins watching, until ctx ends or Stop is called; it returns at
// once, and fails while the watch runs. A stopped watch may be started
// again; what it knew of the cluster (the brokers fenced) stays.
func (w *BrokerWatch) Start(ctx context.Context) error {
	if err := w.loop.Start(ctx, w.run); err != nil {
		return fmt.Errorf("starting the broker watch: %w", err)
	}
	return nil
}

// Stop ends the watch and waits for its probes in flight; it may be called
// twice, and before Start. The clients' connections stay theirs.
func (w *BrokerWatch) Stop() { w.loop.Stop() }

func (w *BrokerWatch) run(ctx context.Context) {
	var client sarama.Client
	defer func() {
		if client != nil {
			_ = client.Close()
		}
		// A probe of a stopped broker ends at its read timeout.
		w.wg.Wait()
		w.mu.Lock()
		probes := slices.Collect(maps.Values(w.probes))
		w.mu.Unlock()
		for _, b := range probes { // not under w.mu: closing takes it
			_ = b.Close()
		}
	}()
	tick := time.NewTicker(w.config.Interval)
	defer tick.Stop()
	for {
		if client == nil {
			// No broker answers yet: the clients say so themselves; try
			// again at the next tick.
			client, _ = sarama.NewClient(w.seeds, w.probe)
		}
		if client != nil {
			if err := client.RefreshMetadata(w.topics...); err == nil {
				var alive []string
				for _, b := range client.Brokers() {
					alive = append(alive, b.Addr())
				}
				w.observe(ctx, alive)
				for _, a := range alive {
					w.probe1(a)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probe1 asks the broker at addr for its API versions, on a connection of
// the watch's own, unless a probe to it is still in flight; an answer is
// recorded in answered. A broker that answers is not hung, whatever a
// client's request waits for there: a JoinGroup is answered only when the
// join phase ends, up to the rebalance timeout; a stopped broker answers
// nothing. run waits for the probes in flight before it returns, and
// closes their connections.
func (w *BrokerWatch) probe1(addr string) {
	w.mu.Lock()
	if w.probing[addr] {
		w.mu.Unlock()
		return
	}
	w.probing[addr] = true
	b := w.probes[addr]
	if b == nil {
		b = sarama.NewBroker(addr)
		w.probes[addr] = b
	}
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		err := b.Open(w.probe)
		if err == nil || errors.Is(err, sarama.ErrAlreadyConnected) {
			_, err = b.ApiVersions(&sarama.ApiVersionsRequest{})
		}
		if err != nil {
			// A new connection at the next probe: a timed-out one is
			// broken for good. (Not under w.mu: closing takes it.)
			_ = b.Close()
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.probing, addr)
		if err != nil {
			delete(w.probes, addr)
			return
		}
		w.answered[addr] = time.Now()
	}()
}

// observe takes the brokers that a metadata response named.
func (w *BrokerWatch) observe(ctx context.Context, alive []string) {
	if len(alive) == 0 {
		return
	}
	var cut []*watchedConn
	var gone, back []string
	w.mu.Lock()
	for _, a := range alive {
		w.known[a] = true
		if w.fenced[a] {
			delete(w.fenced, a)
			back = append(back, a)
		}
	}
	for a := range w.known {
		if w.fenced[a] || slices.Contains(alive, a) {
			continue
		}
		w.fenced[a] = true
		gone = append(gone, a)
		for c := range w.conns[a] {
			cut = append(cut, c)
		}
	}
	w.mu.Unlock()
	for _, c := range cut {
		_ = c.Close()
	}
	for _, a := range gone {
		w.config.Logger.WarnContext(ctx, "Kafka broker fenced by the cluster (absent from its metadata); its connections are cut until it is back",
			slog.String("broker", a), slog.Int("connections_cut", len(cut)))
	}
	for _, a := range back {
		w.config.Logger.InfoContext(ctx, "Kafka broker back in the cluster's metadata", slog.String("broker", a))
	}
}

// Hung returns the address of a broker that has left a request of this
// watch's clients unanswered for longer than HungAfter, and for how long;
// "" if none.
func (w *BrokerWatch) Hung() (string, time.Duration) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var addr string
	var longest time.Duration
	for a, conns := range w.conns {
		if now.Sub(w.answered[a]) <= w.config.HungAfter {
			continue // it answers the watch: what waits there waits by design
		}
		for c := range conns {
			if d := c.waiting(now); d > w.config.HungAfter && d > longest {
				addr, longest = a, d
			}
		}
	}
	return addr, longest
}

// watchedConn is a connection to a broker that the watch can cut, and
// that knows since when it waits for an answer: from the first write after
// the last byte read (an approximation that holds for a broker that stops
// answering altogether).
type watchedConn struct {
	net.Conn
	addr  string
	watch *BrokerWatch

	mu    sync.Mutex
	since time.Time // zero: not waiting
	once  sync.Once
}

func (c *watchedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.since.IsZero() && len(b) > 0 {
		c.since = time.Now()
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		c.since = time.Time{}
		c.mu.Unlock()
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.once.Do(func() {
		c.watch.mu.Lock()
		delete(c.watch.conns[c.addr], c)
		if len(c.watch.conns[c.addr]) == 0 {
			delete(c.watch.conns, c.addr)
		}
		c.watch.mu.Unlock()
	})
	return c.Conn.Close()
}

func (c *watchedConn) waiting(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since.IsZero() {
		return 0
	}
	return now.Sub(c.since)
}
