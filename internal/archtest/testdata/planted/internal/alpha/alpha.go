// Package alpha is a planted module with one violation of each kind.
package alpha

import (
	"fmt"

	_ "example.com/planted/internal/api"
)

const own = `SELECT id FROM alpha_rows`

const foreign = `SELECT a.id FROM alpha_rows a JOIN beta_rows b ON a.id = b.id`

func tenant() string { return "root" }

const dir = "root" // archtest:not-tenant (a directory name)

var _ = fmt.Sprint(own, foreign, dir)
