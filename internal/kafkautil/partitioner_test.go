package kafkautil_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

// Vectors from Kafka's UtilsTest.testMurmur2 (Java int values).
func TestMurmur2MatchesJava(t *testing.T) {
	t.Parallel()
	cases := map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	}
	for in, want := range cases {
		require.Equal(t, want, int32(kafkautil.Murmur2([]byte(in))), in)
	}
}

func TestMurmur2PartitionMasksSignBit(t *testing.T) {
	t.Parallel()
	// murmur2("21") is negative as a Java int: Java masks the sign bit
	// ((-973932308 & 0x7fffffff) % 16 = 12), it does not negate (abs would give 4).
	require.Equal(t, int32(12), kafkautil.Murmur2Partition([]byte("21"), 16))
}
