package kafkautil

import "github.com/twmb/franz-go/pkg/kfake"

// Cluster gives tests the embedded broker's cluster, to make it answer
// as Apache Kafka does where kfake does not.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }
