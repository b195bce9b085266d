package storetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// Model is the oracle of the suite: a store that keeps every record in a
// map under one mutex and runs ratelimit.Evaluate, the one definition of
// the semantics, with nothing else in the way. It never forgets a record.
type Model struct {
	mu    sync.Mutex
	recs  map[driver.RecordID]driver.State
	marks map[[16]byte]modelMark // settlements: never forgotten
}

var (
	_ ratelimit.Store     = (*Model)(nil)
	_ driver.BatchApplier = (*Model)(nil)
)

// modelMark is a settlement's mark: its kind and settler.
type modelMark struct {
	kind    driver.SettleKind
	settler [16]byte
}

// NewModel returns an empty Model.
func NewModel() *Model {
	return &Model{recs: make(map[driver.RecordID]driver.State), marks: make(map[[16]byte]modelMark)}
}

// Apply implements ratelimit.Store.
func (m *Model) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := driver.CheckOut(op, out); err != nil {
		return fmt.Errorf("model: Apply: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if op.Settle != nil {
		if k, ok := m.marks[op.Settle.ID]; ok {
			op.SettledBeforeBy(k.kind, k.settler, out)
			return nil
		}
		m.marks[op.Settle.ID] = modelMark{op.Settle.Kind, op.Settle.Settler}
	}
	ids := op.AppendRecordIDs(nil)
	prev := make([]driver.Record, len(ids))
	next := make([]driver.Update, len(ids))
	for i, id := range ids {
		s, ok := m.recs[id]
		prev[i] = driver.Record{State: s, Found: ok}
	}
	ratelimit.Evaluate(op, prev, out, next)
	for i, u := range next {
		if u.Write {
			m.recs[ids[i]] = u.State
		}
	}
	return nil
}

// Load implements ratelimit.Store.
func (m *Model) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := driver.CheckRecords(ids, out); err != nil {
		return fmt.Errorf("model: Load: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, id := range ids {
		s, ok := m.recs[id]
		out[i] = driver.Record{State: s, Found: ok}
	}
	return nil
}

// Delete implements ratelimit.Store.
func (m *Model) Delete(ctx context.Context, ids []driver.RecordID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		delete(m.recs, id)
	}
	return nil
}

// ApplyBatch implements driver.BatchApplier: Apply, op after op. Outs of
// the wrong length, or an invalid op, are refused before any op is
// decided.
func (m *Model) ApplyBatch(ctx context.Context, ops []*driver.Op, outs [][]driver.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := driver.CheckOuts(ops, outs); err != nil {
		return fmt.Errorf("model: ApplyBatch: %w", err)
	}
	for i, op := range ops {
		if err := m.Apply(ctx, op, outs[i]); err != nil {
			return err
		}
	}
	return nil
}
