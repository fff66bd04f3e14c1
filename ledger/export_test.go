package ledger

// GroupCommitCounts reports how many transactions combined several
// sessions, and how many of those failed and were sent again one by one.
func GroupCommitCounts(c *Claims) (combined, separated int64) {
	return c.group.combined.Load(), c.group.separated.Load()
}
