package pgdb

// SetDefaultURL points Open's default at url for one test and returns the
// function that restores it. Tests that call it must not run in parallel
// with other tests of Open's default.
func SetDefaultURL(url string) (restore func()) {
	old := defaultURL
	defaultURL = url
	return func() { defaultURL = old }
}
