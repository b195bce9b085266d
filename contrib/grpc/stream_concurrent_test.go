package ratelimitgrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Streams of one client, opened and fed at once (run with -race), share
// its budget with each other message by message: of all the opens and
// messages, the limit grants as many as it holds tokens, each once (the
// open's token buys the stream's first message); every stream ends either
// with the refusal of its open or of a message past the budget, or with
// its messages all sent.
func TestStreamMessagesConcurrent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const budget = 40
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{
		"chat": {Kind: ratelimit.FixedWindow, Rate: budget, Period: time.Hour},
	})
	ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages())
	require.NoError(t, err)
	chat := &chatServer{}
	conn := serveChat(t, chat, ic.Stream())

	const streams, each = 8, 10
	var acked, refused, completed atomic.Int64
	var wg sync.WaitGroup
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, err := conn.NewStream(ctx, &talkDesc, talkMethod)
			if !assert.NoError(t, err) {
				return
			}
			for i := range each {
				if err := cs.SendMsg(wrapperspb.String(strconv.Itoa(i))); err != nil && !errors.Is(err, io.EOF) {
					t.Errorf("send: %v", err)
					return
				}
				reply := new(wrapperspb.StringValue)
				err := cs.RecvMsg(reply)
				switch {
				case err == nil:
					acked.Add(1)
					continue
				case status.Code(err) == codes.ResourceExhausted:
					refused.Add(1) // at the open, or a message: the stream ended
				default:
					t.Errorf("recv: %v", err)
				}
				return
			}
			assert.NoError(t, cs.CloseSend())
			assert.ErrorIs(t, cs.RecvMsg(new(wrapperspb.StringValue)), io.EOF)
			completed.Add(1)
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(budget), acked.Load(), "every token bought one message, once")
	assert.Equal(t, int64(streams), refused.Load()+completed.Load(), "each stream ended refused or completed")
	assert.Positive(t, refused.Load(), "80 messages were asked for 40 tokens")
	assert.Zero(t, remaining(t, lim, "chat"))
}
