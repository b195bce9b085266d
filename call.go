package ratelimit

// The options of one call: how many tokens it asks for, whether it may
// reserve or wants a receipt, and a limit given inline.

// CallOption modifies one call of Limit, Check or Reserve.
// It is a value, so that options cost no allocation.
type CallOption struct {
	set   callField
	count float64
	cfg   *Config
}

type callField uint8

const (
	setCount callField = iota + 1
	setReserve
	setConfig
	setReceipt
)

type call struct {
	count   float64
	reserve bool
	receipt bool
	cfg     *Config
	// reservation is set for Reserve: should the observer panic as it is
	// told of the call's charge, the tokens go back (observeCharged).
	reservation bool
}

// Count sets how many tokens the call asks for (default 1). It must be a
// finite number ≥ 0, and 0 or at least MinCount. A count of 0 takes nothing and reads the bucket: it
// is OK unless the bucket owes tokens (reservations), even with none
// left, and Remaining says how many there are.
func Count(n float64) CallOption { return CallOption{set: setCount, count: n} }

// WithReserve lets the call take tokens it cannot have yet: it is OK with a
// RetryAfter that says when the tokens will have been granted, up to the
// limit's MaxReserved.
func WithReserve() CallOption { return CallOption{set: setReserve} }

// WithConfig gives the config of a limit not declared (in New, SetLimits or
// SetLimit). Using it with a declared name is an error unless the configs
// are equal. The deny cache (WithDenyCache) does not keep the calls of a
// config given inline: calls of an undeclared name may each give another.
func WithConfig(cfg Config) CallOption { return CallOption{set: setConfig, cfg: &cfg} }

// newCall returns the call that opts describe.
func newCall(opts []CallOption) call {
	c := call{count: 1}
	for _, o := range opts {
		switch o.set {
		case setCount:
			c.count = o.count
		case setReserve:
			c.reserve = true
		case setConfig:
			c.cfg = o.cfg
		case setReceipt:
			c.receipt = true
		}
	}
	return c
}

// WithReceipt makes Limit or LimitAll return, when the call is OK and was
// decided by the store, a Token of the charge in Result.Token, for
// Settle, Use or Refund by any process later: a charge settled by its
// outcome. With WithReserve the token is the reservation's. A Check
// charges nothing and gets no receipt: Result.Token stays nil. A call whose
// receipt would be too large to read back (ParseToken), such as a
// LimitAll of more than 512 sharded limits, is refused with an error
// matching ErrInvalidConfig before it charges anything.
func WithReceipt() CallOption { return CallOption{set: setReceipt} }
