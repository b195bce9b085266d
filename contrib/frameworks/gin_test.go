package frameworks_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ginLimit puts an httplimit middleware in a gin chain: gin has no
// wrapper for net/http middleware. The route's pattern and parameters
// become the request's, as PathValue and the middleware's logs read them;
// a request the middleware refuses is aborted with its response.
func ginLimit(mw *httplimit.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Request.Pattern = c.FullPath()
		for _, p := range c.Params {
			c.Request.SetPathValue(p.Key, p.Value)
		}
		passed := false
		mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			passed = true
			c.Request = r
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
		if !passed {
			c.Abort()
		}
	}
}

func TestGin(t *testing.T) {
	gin.SetMode(gin.TestMode)
	mw := newMiddleware(t)
	var reached int
	r := gin.New()
	r.Use(ginLimit(mw))
	r.GET("/hello", gin.WrapF(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(r, "/hello"))
	}
	wantLimited(t, got)
	assert.Equal(t, 2, reached)
}

func TestGinPathValue(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var reached, after int
	r := gin.New()
	g := r.Group("/t/:tenant", ginLimit(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant")))),
		func(*gin.Context) { after++ })
	g.GET("/items", gin.WrapF(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(r, "/t/acme/items"))
	}
	wantLimited(t, got)
	assert.Equal(t, 200, get(r, "/t/globex/items").status, "another tenant, another bucket")
	assert.Equal(t, 3, reached)
	assert.Equal(t, 3, after, "the handlers after the limit run only for requests it passed")
}

// The adapter in docs/http.md is this file's, word for word.
func TestGinAdapterDocumented(t *testing.T) {
	src, err := os.ReadFile("gin_test.go")
	require.NoError(t, err)
	doc, err := os.ReadFile("../../docs/http.md")
	require.NoError(t, err)
	fn := funcText(t, string(src), "func ginLimit(")
	assert.True(t, strings.Contains(string(doc), fn), "docs/http.md does not hold ginLimit as gin_test.go has it:\n%s", fn)
}

// funcText returns the declaration starting with start, up to its closing
// brace at the start of a line.
func funcText(t *testing.T, src, start string) string {
	t.Helper()
	i := strings.Index(src, start)
	require.GreaterOrEqual(t, i, 0, "%s not found", start)
	end := strings.Index(src[i:], "\n}\n")
	require.GreaterOrEqual(t, end, 0)
	return src[i : i+end+2]
}
