package replay

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// Range is the part of one partition to replay: offsets [From, To).
type Range struct {
	Partition int32 `json:"partition"`
	// From is the first offset to replay.
	From int64 `json:"from"`
	// To is the first offset not to replay (exclusive).
	To int64 `json:"to"`
}

// Empty reports whether the range holds no offset.
func (r Range) Empty() bool { return r.From >= r.To }

// OffsetSpec is the value of --from-offset or --to-offset: one offset for
// every partition ("N"), or offsets per partition ("P:N,P:N"). The zero
// value sets nothing.
type OffsetSpec struct {
	all   *int64
	byPar map[int32]int64
}

// ParseOffsetSpec parses "N" or "P:N,P:N,...".
func ParseOffsetSpec(s string) (OffsetSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return OffsetSpec{}, nil
	}
	if !strings.Contains(s, ":") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return OffsetSpec{}, fmt.Errorf("want a non-negative offset N or P:N,P:N, got %q", s)
		}
		return OffsetSpec{all: &n}, nil
	}
	spec := OffsetSpec{byPar: map[int32]int64{}}
	for part := range strings.SplitSeq(s, ",") {
		ps, ns, ok := strings.Cut(strings.TrimSpace(part), ":")
		p, perr := strconv.ParseInt(ps, 10, 32)
		n, nerr := strconv.ParseInt(ns, 10, 64)
		if !ok || perr != nil || nerr != nil || p < 0 || n < 0 {
			return OffsetSpec{}, fmt.Errorf("want P:N with a partition and an offset, got %q", part)
		}
		if _, dup := spec.byPar[int32(p)]; dup {
			return OffsetSpec{}, fmt.Errorf("partition %d given twice", p)
		}
		spec.byPar[int32(p)] = n
	}
	return spec, nil
}

// IsSet reports whether the spec names any offset.
func (s OffsetSpec) IsSet() bool { return s.all != nil || len(s.byPar) > 0 }

// For returns the offset the spec gives partition p, if any.
func (s OffsetSpec) For(p int32) (int64, bool) {
	if s.all != nil {
		return *s.all, true
	}
	n, ok := s.byPar[p]
	return n, ok
}

// Partitions lists the partitions named explicitly (P:N form).
func (s OffsetSpec) Partitions() []int32 {
	out := make([]int32, 0, len(s.byPar))
	for p := range s.byPar {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// FormatOffsets renders offsets per partition in the P:N,P:N form that
// ParseOffsetSpec reads.
func FormatOffsets(offsets map[int32]int64) string {
	parts := make([]int32, 0, len(offsets))
	for p := range offsets {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d:%d", p, offsets[p])
	}
	return b.String()
}

// ParsePartitions parses "0,3,5".
func ParsePartitions(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int32
	for f := range strings.SplitSeq(s, ",") {
		p, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("want partition numbers like 0,3,5, got %q", f)
		}
		out = append(out, int32(p))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Bounds say where a replay starts and ends. From and FromTime are
// exclusive of each other, as are To and ToTime.
type Bounds struct {
	// Partitions to replay. Defaults to all partitions of the topic (or,
	// when From or To name partitions, those).
	Partitions []int32
	// From is the first offset per partition. Defaults to the oldest.
	From OffsetSpec
	// To is the first offset not replayed, per partition. Defaults to the
	// high-water mark at start, so a replay ends while producers go on.
	To OffsetSpec
	// FromTime starts at the first message whose timestamp is at or
	// after it (ListOffsets by timestamp). Defaults to unset.
	FromTime time.Time
	// ToTime ends before the first message whose timestamp is at or after
	// it. Defaults to unset.
	ToTime time.Time
}

// offsetClient is what Resolve needs of a Sarama client.
type offsetClient interface {
	Partitions(topic string) ([]int32, error)
	GetOffset(topic string, partition int32, time int64) (int64, error)
}

var _ offsetClient = (sarama.Client)(nil)

// Resolve turns bounds into one Range per partition, clamped to what the
// partition holds now. Timestamps resolve with ListOffsets: the earliest
// offset whose timestamp is at or after the time, or the high-water mark
// when there is none.
func Resolve(client offsetClient, topic string, b Bounds) ([]Range, error) {
	if b.From.IsSet() && !b.FromTime.IsZero() {
		return nil, errors.New("--from-offset and --from-time exclude each other")
	}
	if b.To.IsSet() && !b.ToTime.IsZero() {
		return nil, errors.New("--to-offset and --to-time exclude each other")
	}
	all, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("listing partitions of %s: %w", topic, err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	parts := b.Partitions
	if len(parts) == 0 {
		named := append(b.From.Partitions(), b.To.Partitions()...)
		slices.Sort(named)
		parts = slices.Compact(named)
	}
	if len(parts) == 0 {
		parts = all
	}
	for _, p := range parts {
		if !slices.Contains(all, p) {
			return nil, fmt.Errorf("topic %s has no partition %d (it has %d)", topic, p, len(all))
		}
	}
	for _, spec := range []OffsetSpec{b.From, b.To} {
		for _, p := range spec.Partitions() {
			if !slices.Contains(parts, p) {
				return nil, fmt.Errorf("offset given for partition %d, which is not replayed", p)
			}
		}
	}
	out := make([]Range, 0, len(parts))
	for _, p := range parts {
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("oldest offset of %s/%d: %w", topic, p, err)
		}
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("high-water mark of %s/%d: %w", topic, p, err)
		}
		byTime := func(t time.Time) (int64, error) {
			n, err := client.GetOffset(topic, p, t.UnixMilli())
			if err != nil {
				return 0, fmt.Errorf("offset of %s/%d at %s: %w", topic, p, t.Format(time.RFC3339Nano), err)
			}
			if n < 0 { // no message at or after t
				return hwm, nil
			}
			return n, nil
		}
		r := Range{Partition: p, From: oldest, To: hwm}
		if n, ok := b.From.For(p); ok {
			r.From = n
		} else if !b.FromTime.IsZero() {
			if r.From, err = byTime(b.FromTime); err != nil {
				return nil, err
			}
		}
		if n, ok := b.To.For(p); ok {
			r.To = n
		} else if !b.ToTime.IsZero() {
			if r.To, err = byTime(b.ToTime); err != nil {
				return nil, err
			}
		}
		r.From = max(r.From, oldest)
		r.To = min(r.To, hwm)
		out = append(out, r)
	}
	return out, nil
}
