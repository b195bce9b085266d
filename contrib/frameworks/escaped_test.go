package frameworks_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gin matches the escaped path when told to (UseRawPath) and, with
// UnescapePathValues off, gives its parameters as written there, as chi
// and echo do: each spelling of a tenant or a file is one budget. Its
// catch-all (*file) starts with the slash before it, which echo's and
// chi's (*) do not: keyed as written, /files/%61 was a budget apart from
// /files/a.
func TestGinPathValueEscapedRaw(t *testing.T) {
	gin.SetMode(gin.TestMode)
	for _, tc := range []struct {
		name, route, param string
		spellings          []string
		other              string
	}{
		{"a parameter", "/t/:tenant/items", "tenant", []string{"/t/acme/items", "/t/%61cme/items", "/t/%61%63me/items"}, "/t/a%2Fb/items"},
		{"a catch-all", "/files/*file", "file", []string{"/files/a/b", "/files/%61/b", "/files/%61/%62"}, "/files/%2561/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reached int
			r := gin.New()
			r.UseRawPath, r.UnescapePathValues = true, false
			r.GET(tc.route, ginLimit(newMiddleware(t, httplimit.WithKey(httplimit.PathValue(tc.param)))), gin.WrapF(hello(&reached)))

			var got []response
			for _, p := range tc.spellings {
				got = append(got, get(r, p))
			}
			wantLimited(t, got)
			assert.Equal(t, http.StatusOK, get(r, tc.other).status, "another key, another bucket")
			assert.Equal(t, 3, reached)
		})
	}
}

// By default gin matches the unescaped path, and gives its parameters
// unescaped: a "%" in one is the client's, not an escape, and is kept.
func TestGinPathValueEscaped(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var reached int
	r := gin.New()
	r.GET("/files/*file", ginLimit(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("file")))), gin.WrapF(hello(&reached)))

	wantLimited(t, []response{get(r, "/files/a/b"), get(r, "/files/%61/b"), get(r, "/files/%61/%62")})
	assert.Equal(t, http.StatusOK, get(r, "/files/%2561/b").status, "the file %61/b, another bucket")
	assert.Equal(t, http.StatusOK, get(r, "/files/%2561/b").status)
	assert.Equal(t, http.StatusTooManyRequests, get(r, "/files/%2561/b").status)
}

// However gin matches and gives its catch-all, PathValue keys a request
// by the file the path names, unescaped, with the slash gin starts it
// with: each spelling of a file (an escaped letter, slash or "%") is the
// file's budget, and no two files share one.
func TestGinPathValueCatchAllIsTheFile(t *testing.T) {
	gin.SetMode(gin.TestMode)
	paths := []string{"/files/a", "/files/%61", "/files/a/b", "/files/a%2Fb", "/files/%61%2F%62", "/files/%2561", "/files/%25", "/files/%2525",
		"/files//a", "/files//%61", "/files/%2F%61", "/files/a%2F", "/files/", "/files/%2F", "/files/%252F", "/files/%2f",
		"/files/a%20b", "/files/%2Ba", "/files/%e2%82%ac", "/files/%C0%AF", "/files/a%3Bb", "/files/a%3Fb"}
	for _, mode := range []struct{ useRawPath, unescape bool }{{false, true}, {true, false}, {true, true}} {
		r := gin.New()
		r.UseRawPath, r.UnescapePathValues = mode.useRawPath, mode.unescape
		r.GET("/files/*file", func(c *gin.Context) {
			c.Request.Pattern = c.FullPath()
			for _, p := range c.Params {
				c.Request.SetPathValue(p.Key, p.Value)
			}
			key, err := httplimit.PathValue("file")(c.Request)
			require.NoError(t, err)
			file, err := url.PathUnescape(strings.TrimPrefix(c.Request.URL.EscapedPath(), "/files"))
			require.NoError(t, err)
			assert.Equal(t, file, key, "%s, %+v (gin gave %q)", c.Request.URL.EscapedPath(), mode, c.Param("file"))
			c.Status(http.StatusNoContent)
		})
		for _, p := range paths {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, p, nil))
			require.Equal(t, http.StatusNoContent, w.Code, "%s, %+v", p, mode)
		}
	}
}
