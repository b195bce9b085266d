package httplimit_test

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

func prefixed(prefix string, key httplimit.KeyFunc) httplimit.KeyFunc {
	return func(r *http.Request) (string, error) {
		k, err := key(r)
		if err != nil || k == "" {
			return "", err // no key stays no key: 400, not one budget named by the prefix
		}
		return prefix + k, nil
	}
}

// The helper docs/http.md gives to keep the keys of two KeyFuncs apart
// made an empty key, which the middleware refuses as no key, the prefix
// alone: every request of a KeyFunc of the caller's that returned "" for
// a missing header shared one budget. The helper above is the
// documentation's, word for word.
func TestPrefixedKeepsNoKeyNoKey(t *testing.T) {
	src, err := os.ReadFile("prefixed_test.go")
	require.NoError(t, err)
	doc, err := os.ReadFile("../docs/http.md")
	require.NoError(t, err)
	s := string(src)
	helper := s[strings.Index(s, "func prefixed"):]
	helper = helper[:strings.Index(helper, "\n}\n")+3]
	require.Contains(t, string(doc), helper, "docs/http.md's prefixed is not this test's")

	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	user := func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }
	mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(prefixed("user:", user))))
	require.Equal(t, http.StatusOK, serve(mw.Wrap(ok), "192.0.2.1:1", "X-User", "alice").Code)
	require.Equal(t, http.StatusBadRequest, serve(mw.Wrap(ok), "192.0.2.1:1").Code, "no user, no key")
	mw = must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(prefixed("key:", httplimit.Header("X-API-Key")))))
	require.Equal(t, http.StatusBadRequest, serve(mw.Wrap(ok), "192.0.2.1:1").Code)
}
