package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// limitErrorTexts returns how a LimitError shows name and key.
func limitErrorTexts(t *testing.T, name, key string) (nameText, keyText string) {
	t.Helper()
	msg := (&ratelimit.LimitError{Name: name, Key: key, RetryAfter: time.Second}).Error()
	rest, ok := strings.CutPrefix(msg, "ratelimit: limit ")
	require.True(t, ok, msg)
	nameText, rest, ok = strings.Cut(rest, " exceeded for key ")
	require.True(t, ok, msg)
	keyText, ok = strings.CutSuffix(rest, ": retry after 1s")
	require.True(t, ok, msg)
	return nameText, keyText
}

// configErrorName returns how a ConfigError shows name.
func configErrorName(t *testing.T, name string) string {
	t.Helper()
	msg := (&ratelimit.ConfigError{Name: name, Field: "Rate", Problem: "is 0"}).Error()
	text, ok := strings.CutPrefix(msg, "ratelimit: limit ")
	require.True(t, ok, msg)
	text, ok = strings.CutSuffix(text, ": Rate is 0")
	require.True(t, ok, msg)
	return text
}

// A LimitError shows its name and key as a ConfigError shows a name:
// quoted, with control characters and bytes that are not UTF-8 escaped,
// and, when long, cut at a character's start (the key at 64 bytes, the
// name at 256, as ConfigError's) and followed by the length. A long key
// of bytes that are not UTF-8 was cut to nothing (strings.ToValidUTF8
// dropped them all), and a long name was shown whole.
func TestLimitErrorShowsTextAsConfigError(t *testing.T) {
	for _, s := range []string{
		"user-42",
		"\xff\xfe",
		"\x1b[2J\x1b[31mred\r\n",
		"é\x00\u202e",
		strings.Repeat("\xff", 64),
		strings.Repeat("\xff", 300),
		strings.Repeat("\x1b", 300),
		"a" + strings.Repeat("é", 200),
		strings.Repeat("é", 1<<19),
	} {
		nameText, keyText := limitErrorTexts(t, s, s)
		require.Equal(t, configErrorName(t, s), nameText, "name %q", s)
		if len(s) <= 64 {
			require.Equal(t, configErrorName(t, s), keyText, "key %q", s)
		}
	}

	_, key := limitErrorTexts(t, "api", strings.Repeat("\xff", 100))
	require.Equal(t, `"`+strings.Repeat(`\xff`, 64)+`"… (100 bytes)`, key)
	_, key = limitErrorTexts(t, "api", strings.Repeat("\x1b", 100))
	require.Equal(t, `"`+strings.Repeat(`\x1b`, 64)+`"… (100 bytes)`, key)
	_, key = limitErrorTexts(t, "api", "a"+strings.Repeat("é", 40))
	require.Equal(t, `"a`+strings.Repeat("é", 31)+`"… (81 bytes)`, key, "cut at a character's start")
	_, key = limitErrorTexts(t, "api", strings.Repeat("é", 40)+"\xff")
	require.Equal(t, `"`+strings.Repeat("é", 32)+`"… (81 bytes)`, key)

	name, _ := limitErrorTexts(t, strings.Repeat("n", 1000), "k")
	require.Equal(t, `"`+strings.Repeat("n", 256)+`"… (1000 bytes)`, name)
}

// A CountError and a StoreError show the limit's name as a LimitError
// and a ConfigError do, the latter through each of its messages (a call's,
// one the breaker answered, a Reset's or Value's). They showed a long name
// whole.
func TestCountAndStoreErrorsShowTheNameAsConfigError(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"api", "\xff\x1b[2J", strings.Repeat("é", 200), strings.Repeat("n", 1000)} {
		want := configErrorName(t, name)
		texts := map[string]string{
			"CountError":            (&ratelimit.CountError{Name: name, Count: -1, Problem: "is negative"}).Error(),
			"StoreError":            (&ratelimit.StoreError{Name: name, Err: errors.New("down")}).Error(),
			"StoreError, not asked": (&ratelimit.StoreError{Name: name, Until: t0}).Error(),
		}
		store := &typedNilStore{Store: must(memstore.New())}
		store.fail.Store("Load")
		lim := must(ratelimit.New(store, ratelimit.Limits{name: {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}},
			ratelimit.WithClock(newMock())))
		_, err := lim.Value(ctx, name, "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		texts["StoreError of Value"] = err.Error()
		for what, text := range texts {
			_, after, ok := strings.Cut(text, "limit ")
			require.True(t, ok, "%s: %s", what, text)
			require.True(t, strings.HasPrefix(after, want+":"), "%s of %d bytes: got %.400s, want the name as %.400s", what, len(name), after, want)
		}
	}
}
