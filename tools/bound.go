package tools

import "unicode/utf8"

const truncatedMark = "…[truncated]"

// bound returns s if it fits in max bytes, else a prefix of s cut on a rune
// boundary and marked as truncated, max bytes in all.
func bound(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max - len(truncatedMark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + truncatedMark
}
