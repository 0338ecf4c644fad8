package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func keysCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "keys",
		Short: "Manage API keys (over the daemon's local socket only)",
		Long: "An API key admits requests over TCP and is a tenant: it sees only its tenant's sandboxes. " +
			"Keys are managed over the daemon's unix socket.",
		Args: noArgs,
	}
	c.AddCommand(keysCreateCmd(g), keysLsCmd(g), keysRevokeCmd(g))
	return c
}

func keysCreateCmd(g *globals) *cobra.Command {
	var tenant string
	var expires time.Duration
	c := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a key and print its secret, which is shown only this once",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), args[0], hutch.KeyOptions{Tenant: tenant, ExpiresIn: expires})
			if err != nil {
				return err
			}
			if !g.json() {
				fmt.Fprintf(g.errOut, "key %s (tenant %s); its secret is shown only now:\n", k.Key.ID, k.Key.Tenant)
			}
			return g.print(k, func(w io.Writer) { fmt.Fprintln(w, k.Secret) })
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant the key acts for (default: a tenant of its own)")
	c.Flags().DurationVar(&expires, "expires", 0, "the key stops working after this long, e.g. 24h (default: never)")
	return c
}

func keysLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List keys (never their secrets)",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ks, err := c.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			return g.print(ks, func(w io.Writer) { keyTable(w, ks) })
		},
	}
}

func keyTable(w io.Writer, ks []hutch.Key) {
	fmt.Fprintln(w, "ID\tNAME\tTENANT\tPREFIX\tCREATED\tSTATUS")
	for _, k := range ks {
		st := "active"
		switch {
		case k.RevokedAt != nil:
			st = "revoked"
		case k.ExpiresAt != nil && k.ExpiresAt.Before(time.Now()):
			st = "expired"
		case k.ExpiresAt != nil:
			st = "expires " + k.ExpiresAt.Local().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Tenant, k.Prefix, ago(k.CreatedAt), st)
	}
}

func keysRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key (by id or prefix)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.RevokeKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.print(k, func(w io.Writer) { fmt.Fprintln(w, k.ID) })
		},
	}
}
