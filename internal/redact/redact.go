package redact

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// Mask replaces a secret.
const Mask = "****"

// placeholder stands for Mask while net/url encodes the URL (it would
// escape nothing in it, but the intent is plainer this way).
const placeholder = "REDACTEDREDACTED"

// secretParam matches, case-insensitively, the names of query parameters
// (and key=value settings) whose value is a secret. It matches inside
// longer names too (access_token, X-Amz-Signature, client_secret): hiding
// a harmless value costs nothing, showing a secret one does.
var secretParam = regexp.MustCompile(`(?i)token|secret|passw|pwd|key|sig|auth|credential`)

// SecretName reports whether a parameter or setting named name holds a
// secret.
func SecretName(name string) bool { return secretParam.MatchString(name) }

// URL returns s with its secrets masked. A URL that net/url parses keeps
// its shape (scheme, user name, host, path) with the password and the
// values of secret query parameters masked; anything else (a password
// with an unescaped '/' or '@', a key=value connection string, a flag
// value holding a URL) is masked by pattern: whatever sits between
// "scheme://user:" and the last '@' of the word, the values of secret
// parameters, and password=... settings. A value that is one URL net/url
// refused (a user name or password with a space or a quote), or the url=
// item of a flag value, is masked from "scheme://" to its last '@'.
func URL(s string) string {
	u, err := url.Parse(s)
	// An '@' after the host with "scheme://user:" before it: a password
	// with an unescaped '/' that net/url took for the end of the host
	// ("postgres://app:1/x@db" parses as host app, port 1).
	misread := err == nil && strings.ContainsRune(u.EscapedPath()+u.RawQuery, '@') && userinfo.MatchString(s)
	if err == nil && !misread && u.Scheme != "" && u.Host != "" && u.Opaque == "" {
		if u.User != nil {
			// A user name masked before (wholeUserinfo: free text masked
			// twice) stays as it reads: net/url would escape its '*'.
			name := u.User.Username()
			if name == Mask {
				name = placeholder
			}
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(name, placeholder)
			} else {
				u.User = url.User(name)
			}
		}
		u.RawQuery = maskQuery(u.RawQuery)
		return strings.ReplaceAll(u.String(), placeholder, Mask)
	}
	if err != nil && !userinfo.MatchString(s) {
		s = wholeUserinfo.ReplaceAllString(s, "${1}"+Mask+"@")
	}
	return byPattern(s)
}

// maskQuery masks the values of secret parameters, keeping the order and
// the encoding of the others.
func maskQuery(q string) string {
	if q == "" {
		return q
	}
	parts := strings.Split(q, "&")
	for i, p := range parts {
		k, _, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if SecretName(name) {
			parts[i] = k + "=" + placeholder
		}
	}
	return strings.Join(parts, "&")
}

var (
	// userinfo: from "scheme://user:" to the last '@' of the word.
	userinfo = regexp.MustCompile(`(://[^:/@\s"'<>]*:)[^\s"'<>` + "`" + `]*@`)
	// wholeUserinfo: a value that is one URL net/url refused, and whose
	// userinfo the word rule cannot find, from "scheme://" to its last
	// '@': a user name or a password may hold a space, a quote or a '<',
	// where the word ends. The user name goes too: where it ends cannot be
	// told either.
	wholeUserinfo = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.\-]*://)(?s:.*)@`)
	// itemUserinfo: the same for the url= item of a comma-separated flag
	// value (--http-tool-endpoint, --mcp-server) whose userinfo holds such
	// a character, to its last '@' before the next item.
	itemUserinfo = regexp.MustCompile(`((?:^|,)\s*url=[a-zA-Z][a-zA-Z0-9+.\-]*://)[^,@]*[\s"'<>` + "`" + `][^,]*@`)
	// secretQuery: a secret parameter's value, in a query or a
	// comma/semicolon separated list.
	secretQuery = regexp.MustCompile(`(?i)([?&;,]\s*[a-z0-9_.\-]*(?:token|secret|passw|pwd|key|sig|auth|credential)[a-z0-9_.\-]*=)[^&;,\s"'<>#]*`)
	// keyword: a key=value password (libpq connection strings).
	keyword = regexp.MustCompile(`(?i)(\b(?:password|passwd|pwd)\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s,;&]+)`)
)

func byPattern(s string) string {
	s = itemUserinfo.ReplaceAllString(s, "${1}"+Mask+"@")
	s = userinfo.ReplaceAllString(s, "${1}"+Mask+"@")
	s = secretQuery.ReplaceAllString(s, "${1}"+Mask)
	return keyword.ReplaceAllString(s, "${1}"+Mask)
}

// urlInText finds what looks like a URL in free text: a scheme, "://",
// and everything up to a space or a quote (net/http quotes the URL in its
// errors).
var urlInText = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s"'<>` + "`" + `]+`)

// Text returns s with the secrets of every URL in it masked, and of
// key=value passwords: for error texts and log lines.
func Text(s string) string {
	s = urlInText.ReplaceAllStringFunc(s, URL)
	return keyword.ReplaceAllString(s, "${1}"+Mask)
}

// Error returns err with its text redacted (Text); errors.Is and errors.As
// still see the errors it wraps. Nil stays nil.
//
// A URL net/url refused (a *url.Error in err's chain: a password with a
// space or a quote) is masked as a whole value first, raw and as %q
// quotes it: in free text its end cannot be told (urlInText stops at a
// space or a quote), and the rest of the password would show.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for e := err; e != nil; {
		var ue *url.Error
		if !errors.As(e, &ue) {
			break
		}
		if ue.URL != "" {
			masked := URL(ue.URL)
			quoted, maskedQuoted := strconv.Quote(ue.URL), strconv.Quote(masked)
			msg = strings.ReplaceAll(msg, quoted[1:len(quoted)-1], maskedQuoted[1:len(maskedQuoted)-1])
			msg = strings.ReplaceAll(msg, ue.URL, masked)
		}
		e = ue.Err
	}
	return &redacted{msg: Text(msg), err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
