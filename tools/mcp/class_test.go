package mcp_test

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	promptmcp "github.com/promptline/promptline/tools/mcp"

	"github.com/promptline/promptline/tools"
)

func TestClassOf(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	for _, tc := range []struct {
		name string
		a    *mcp.ToolAnnotations
		want tools.Class
	}{
		{"NoAnnotations", nil, tools.SideEffecting},
		{"Empty", &mcp.ToolAnnotations{}, tools.SideEffecting},
		{"ReadOnly", &mcp.ToolAnnotations{ReadOnlyHint: true}, tools.Idempotent},
		{"ReadOnlyDestructive", &mcp.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: &yes}, tools.Idempotent},
		{"IdempotentNotDestructive", &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &no}, tools.Idempotent},
		{"IdempotentDestructive", &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &yes}, tools.SideEffecting},
		// destructiveHint defaults to true in the protocol.
		{"IdempotentDestructiveUnset", &mcp.ToolAnnotations{IdempotentHint: true}, tools.SideEffecting},
		{"NotDestructiveOnly", &mcp.ToolAnnotations{DestructiveHint: &no}, tools.SideEffecting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, promptmcp.ClassOf(tc.a))
		})
	}
}

func TestParseOverride(t *testing.T) {
	t.Parallel()
	name, o, err := promptmcp.ParseOverride("fs.write_file=side_effecting")
	require.NoError(t, err)
	require.Equal(t, "fs__write_file", name)
	require.Equal(t, promptmcp.Override{Class: tools.SideEffecting}, o)

	name, o, err = promptmcp.ParseOverride("fs__charge=idempotent!")
	require.NoError(t, err)
	require.Equal(t, "fs__charge", name)
	require.Equal(t, promptmcp.Override{Class: tools.Idempotent, Force: true}, o)

	for _, v := range []string{"fs.x", "=idempotent", "fs.x=sometimes", "fs.x=idempotent!!"} {
		_, _, err := promptmcp.ParseOverride(v)
		require.Error(t, err, v)
	}
}

func TestParseServer(t *testing.T) {
	t.Parallel()
	c, err := promptmcp.ParseServer(`name=fs,command="npx -y '@scope/server x' /tmp/a b"`)
	require.NoError(t, err)
	require.Equal(t, promptmcp.ServerConfig{Name: "fs", Command: []string{"npx", "-y", "@scope/server x", "/tmp/a", "b"}}, c)

	c, err = promptmcp.ParseServer("name=api,url=http://127.0.0.1:1/mcp")
	require.NoError(t, err)
	require.Equal(t, promptmcp.ServerConfig{Name: "api", URL: "http://127.0.0.1:1/mcp"}, c)

	for _, v := range []string{
		"name=fs", "command=ls", "name=a_b,command=ls", "name=a.b,command=ls", `name=fs,command="ls`,
		"name=fs,command=ls,url=http://x/", "name=fs,url=ftp://x/", "name=fs,url=/relative", "name=fs,colour=red",
		`name=fs,command=""`,
	} {
		_, err := promptmcp.ParseServer(v)
		require.Error(t, err, v)
	}
}
