// Package redact hides the secrets a URL or a connection string may carry
// (the userinfo's password, query parameters such as token, key, api_key,
// secret, password, sig, and a key=value password) before the text is
// printed, logged, stored or published. It is the one place that knows
// what a secret in a URL looks like: every other package calls it.
package redact
