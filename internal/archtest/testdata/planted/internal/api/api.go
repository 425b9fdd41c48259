// Package api is a planted transport.
package api
