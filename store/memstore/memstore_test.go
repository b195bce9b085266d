package memstore_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) ratelimit.Store { return memstore.New() })
}

func TestModelConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) ratelimit.Store { return storetest.NewModel() })
}
