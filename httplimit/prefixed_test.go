package httplimit_test

import (
	"net/http"
	"net/http/httptest"
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

// prefixedDocUse is docs/http.md's use of prefixed, word for word but
// the final return: TestPrefixedDocUse keeps the two the same.
func prefixedDocUse(lim *ratelimit.Limiter, mux *http.ServeMux, apiHandler, loginHandler http.Handler) error {
	clientIP, err := httplimit.ClientIP()
	if err != nil {
		return err
	}
	api, err := httplimit.New(lim, []string{"perClient"}, httplimit.WithKey(prefixed("key:", httplimit.Header("X-API-Key"))))
	if err != nil {
		return err
	}
	login, err := httplimit.New(lim, []string{"perClient"}, httplimit.WithKey(prefixed("ip:", clientIP)))
	if err != nil {
		return err
	}
	mux.Handle("/api/", api.Wrap(apiHandler))
	mux.Handle("/login", login.Wrap(loginHandler))
	return nil
}

// TestPrefixedDocUse requires docs/http.md's use of prefixed to be
// prefixedDocUse's body, so that it compiles, and to return New's error:
// it dropped the errors of both middlewares, and went on to Wrap a nil
// one, which panics.
func TestPrefixedDocUse(t *testing.T) {
	src, err := os.ReadFile("prefixed_test.go")
	require.NoError(t, err)
	doc, err := os.ReadFile("../docs/http.md")
	require.NoError(t, err)
	s := string(src)
	body := s[strings.Index(s, "func prefixedDocUse"):]
	body = body[strings.Index(body, "{\n")+2 : strings.Index(body, "\treturn nil\n}\n")]
	body = strings.ReplaceAll(strings.TrimPrefix(body, "\t"), "\n\t", "\n")
	require.True(t, strings.Contains(string(doc), "```go\n"+body+"```\n"), "docs/http.md has no block of prefixedDocUse's body:\n%s", body)

	// The two middlewares keep their keys apart: the API key that spells
	// an address does not spend that address's login budget.
	lim, _ := limiter(t, ratelimit.Limits{"perClient": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}}, nil)
	mux := http.NewServeMux()
	require.NoError(t, prefixedDocUse(lim, mux, ok, ok))
	get := func(path string, headers ...string) int {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = "203.0.113.7:1"
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Add(headers[i], headers[i+1])
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	require.Equal(t, http.StatusOK, get("/api/x", "X-API-Key", "203.0.113.7"))
	require.Equal(t, http.StatusOK, get("/login"))
	require.Equal(t, http.StatusTooManyRequests, get("/login"))

	// A Limiter without the limit: New's error is returned.
	lim, _ = limiter(t, ratelimit.Limits{}, nil)
	require.NotPanics(t, func() {
		require.ErrorIs(t, prefixedDocUse(lim, http.NewServeMux(), ok, ok), ratelimit.ErrUnknownLimit)
	})
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
