package pgdb

import (
	"net"
	"time"
)

// dialer is the pool's dialer: pgconn's own (its connect timeout, TCP
// keepalives), whose connections also give up on a peer that went silent
// (OpenOpts.RoundTripTimeout). Keepalives find a dead peer under an idle
// connection; the user timeout ends a connection whose sent data, or
// whose keepalive probes, stay unacknowledged that long, where the
// kernel's own retransmissions would take about 15 minutes.
func dialer(connectTimeout, roundTrip time.Duration) *net.Dialer {
	idle := max(min(roundTrip/3, 15*time.Second), time.Second)
	return &net.Dialer{
		Timeout: connectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     idle,
			Interval: max(idle/3, time.Second),
			Count:    3,
		},
		Control: userTimeout(roundTrip),
	}
}
