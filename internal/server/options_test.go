package server_test

import (
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/config"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/server"
)

// The default configuration maps to the modules' own defaults: the
// defaults are defined once (config.Default), and FromConfig is the one
// mapping from the TOML configuration to the options.
func TestFromConfigOfTheDefaults(t *testing.T) {
	c := config.Default()
	o, err := server.FromConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if o.RateLimits != api.DefaultRateLimits {
		t.Errorf("rate limits %+v, want api.DefaultRateLimits %+v", o.RateLimits, api.DefaultRateLimits)
	}
	if o.Quotas != quota.Defaults() {
		t.Errorf("quotas %+v, want quota.Defaults %+v", o.Quotas, quota.Defaults())
	}
	if o.TenantMutates != config.DefaultConcurrentMutates || o.AuditSealInterval != time.Hour {
		t.Errorf("tenant mutates %d, seal interval %v", o.TenantMutates, o.AuditSealInterval)
	}
	if o.APIListen != c.API.Listen || o.GatewayListen != c.Gateway.Listen || o.MetricsListen != c.Metrics.Listen ||
		len(o.Roles) != 3 || len(o.GatewayNames) != 1 || o.GatewayNames[0] != "localhost" || o.Clock == nil {
		t.Errorf("options %+v do not carry the configuration", o)
	}
	c.API.TrustedProxies = []string{"10.0.0.0/8"}
	c.API.SessionCookies, c.API.BaseURL = true, "https://bc.example.com"
	c.Audit.Sink, c.Sandboxes.Images = "audit.jsonl", "mem://"
	c.API.InternalListen, c.Gateway.Control = "127.0.0.1:7790", "127.0.0.1:7791"
	if o, err = server.FromConfig(c); err != nil {
		t.Fatal(err)
	}
	if len(o.TrustedProxies) == 0 || !o.SessionCookies || o.BaseURL != c.API.BaseURL || o.AuditSinkName != "audit.jsonl" ||
		o.SandboxImages != "mem://" || o.InternalListen != "127.0.0.1:7790" || o.Control != "127.0.0.1:7791" {
		t.Errorf("options %+v do not carry the configuration", o)
	}
	c.API.TrustedProxies = []string{"not an address"}
	if _, err := server.FromConfig(c); err == nil {
		t.Error("FromConfig took a trusted proxy that is no address")
	}
}
