package redact_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"https://api.example.com/v1/step", "https://api.example.com/v1/step"},
		{"https://u:s3cret@api.example.com/v1", "https://u:****@api.example.com/v1"},
		{"https://api.example.com/hook?token=abc123&x=1", "https://api.example.com/hook?token=****&x=1"},
		{"https://h/p?TOKEN=abc&Api_Key=k&key=k2&secret=s&password=p&sig=g&X-Amz-Signature=z&keep=v",
			"https://h/p?TOKEN=****&Api_Key=****&key=****&secret=****&password=****&sig=****&X-Amz-Signature=****&keep=v"},
		// A password with an unescaped '/' or '@': net/url refuses it.
		{"postgres://app:pa/ss@db.internal:5432/promptline", "postgres://app:****@db.internal:5432/promptline"},
		{"postgres://app:p@ss/w@rd@db:5432/x?sslmode=require", "postgres://app:****@db:5432/x?sslmode=require"},
		{"postgres://app:1/ss@db/x", "postgres://app:****@db/x"},
		{"https://h/users/@me?x=1", "https://h/users/@me?x=1"},
		{"host=db user=app password=s3cret dbname=x", "host=db user=app password=**** dbname=x"},
		{"host=db password='s 3 cret' dbname=x", "host=db password=**** dbname=x"},
		// A flag value holding a URL.
		{"name=n,url=http://u:pw@h/x?token=t,class=bogus", "name=n,url=http://u:****@h/x?token=****,class=bogus"},
		{"ftp://u:pw@h/x?token=t", "ftp://u:****@h/x?token=****"},
		{"not a url", "not a url"},
		// A user name or password with a space, a quote or a '<': net/url
		// refuses it, and where it ends cannot be told: the user name goes
		// too.
		{"http://u:s3cr et@h/", "http://****@h/"},
		{`postgres://app:s3cr"et@db:5432/promptline`, "postgres://****@db:5432/promptline"},
		{"https://u:s3cr<et@h/v1", "https://****@h/v1"},
		{"postgres://my app:s3cr@db:5432/x", "postgres://****@db:5432/x"},
		{`postgres://"app":s3cr@db:5432/x`, "postgres://****@db:5432/x"},
		{"http://a<b:s3cr@h/", "http://****@h/"},
		{"name=n,url=http://u:s3cr et@h/x,class=c", "name=n,url=http://****@h/x,class=c"},
		{"name=n,url=http://my user:s3cr@h/x", "name=n,url=http://****@h/x"},
		// Free text in a value is masked word by word: no more.
		{`name=gh,command="mcp-proxy --url https://api.example.com:8443/mcp --from ops@example.com"`,
			`name=gh,command="mcp-proxy --url https://api.example.com:8443/mcp --from ops@example.com"`},
		{`name=x,command="proxy http://h1:81/a http://u:pw@h2/"`, `name=x,command="proxy http://h1:81/a http://u:****@h2/"`},
	} {
		got := redact.URL(tc.in)
		require.Equal(t, tc.want, got, tc.in)
		for _, secret := range []string{"s3cret", "abc123", "pa/ss", "p@ss", "pw@", "token=t", "s 3 cret", "1/ss", "s3cr"} {
			require.NotContains(t, got, secret, tc.in)
		}
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	// What net/http says when the connection fails: the URL quoted, its
	// password already masked by net/http, its query token not.
	_, err := http.Get("http://u:pw@127.0.0.1:1/hook?token=abc123")
	require.Error(t, err)
	require.Contains(t, err.Error(), "abc123", "net/http prints the query token")
	got := redact.Text(err.Error())
	require.NotContains(t, got, "abc123")
	require.NotContains(t, got, "pw@")
	require.Contains(t, got, "127.0.0.1:1/hook?token=****")

	require.Equal(t, `dial "postgres://a:****@h/db" then password=**** end`,
		redact.Text(`dial "postgres://a:x/y@h/db" then password=hunter2 end`))
}

func TestError(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("sentinel")
	err := redact.Error(fmt.Errorf("calling https://h/x?api_key=k123: %w", sentinel))
	require.ErrorIs(t, err, sentinel)
	require.False(t, strings.Contains(err.Error(), "k123"), err.Error())
	require.NotContains(t, fmt.Sprintf("wrapped: %v", fmt.Errorf("outer: %w", err)), "k123")
	require.NoError(t, redact.Error(nil))
}

// TestErrorOfARefusedURL: net/url's error quotes the URL it refused,
// whole; a password with a space or a quote ends the URL that free text
// can find there, and its rest showed, in a flag's error and in the error
// of a flag value that holds the URL.
func TestErrorOfARefusedURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"http://u:s3cr et@h/", `postgres://app:s3cr"et@db:5432/x`, "https://u:s3cr<et@h/v1", "http://u:s3cr`et@h/",
		"postgres://my app:s3cr@db:5432/x"} {
		_, perr := url.Parse(raw)
		require.Error(t, perr, raw)
		for _, err := range []error{
			fmt.Errorf("--provider-url: %w", perr),
			fmt.Errorf("--http-tool-endpoint %q: URL: %w", "name=x,url="+raw, perr),
		} {
			require.Contains(t, err.Error(), "s3cr", "the test's premise")
			got := redact.Error(err)
			require.NotContains(t, got.Error(), "s3cr", raw)
			require.Contains(t, got.Error(), "****@", raw)
			var ue *url.Error
			require.ErrorAs(t, got, &ue, "still wrapped")
		}
	}
}
