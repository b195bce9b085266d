package main

import (
	"fmt"

	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/spf13/cobra"
)

func newSchema() *cobra.Command {
	var table string
	cmd := &cobra.Command{
		Use:   "schema",
		Short: "Print the SQL that creates or upgrades the PostgreSQL store's table and functions, for migration tools",
		Long: `Print the SQL that creates or upgrades the PostgreSQL store's table and functions.

The application's pgstore.New runs the same SQL at start unless it is given
pgstore.WithoutDDL; with it, apply this SQL beforehand, as a migration. The
SQL is idempotent, and upgrades a table of an earlier release. Apply it in one
transaction, which holds the lock it takes against installs beside it: run a
transaction per statement (psql without --single-transaction), it changes
nothing: its second statement warns (SQLSTATE RLTXN) and ends the session, and
through a pooler in transaction mode, which may run the statements after it on
other sessions, the last one leaves the table's mark as it was (RLTXN). Name
the table's schema (the default is public.ratelimit, the table that
pgstore.New finds for its default name, ratelimit, along the usual
search_path): a name without one is the table in the session's
current_schema(), and the SQL refuses one that finds a relation in another
schema along search_path; its functions then name the table without the
schema, which pgstore.New installs again and refuses with WithoutDDL. It
connects to nothing.`,
		Example: `  ratelimit schema --table public.ratelimit > migrations/0042_ratelimit.up.sql
  ratelimit schema --table limits.records | psql --single-transaction -v ON_ERROR_STOP=1 "$DATABASE_URL"`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sql, err := pgstore.Schema(table)
			if err != nil {
				return usageError{fmt.Errorf("--table: %w", err)}
			}
			fmt.Fprint(cmd.OutOrStdout(), sql)
			return nil
		},
	}
	// The default names its schema: the SQL of a name without one makes
	// functions that pgstore.New WithoutDDL refuses.
	cmd.Flags().StringVar(&table, "table", "public."+pgstore.DefaultTable, `the store's table, as pgstore.WithTable takes it: "schema.table" (or "table", whose functions pgstore.New WithoutDDL refuses)`)
	return cmd
}
