package mcp_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/promptline/promptline/internal/testkit"
)

// stdioServerArg, as the first argument, makes the test binary an MCP
// server over stdio (stdioServer) instead of running the tests.
const stdioServerArg = "mcp-stdio-server"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == stdioServerArg {
		stdioServer()
		return
	}
	testkit.Main(m)
}

// stdioServer serves three tools: echo answers, crash kills the server
// in the middle of the call, pgrp answers the server's process ID and
// process group.
func stdioServer() {
	s := mcp.NewServer(&mcp.Implementation{Name: "stdio-test", Version: "1"}, nil)
	schema := map[string]any{"type": "object"}
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo"}}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "crash", InputSchema: schema},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			os.Exit(3)
			return nil, nil
		})
	s.AddTool(&mcp.Tool{Name: "pgrp", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			text := fmt.Sprintf("%d %d", os.Getpid(), syscall.Getpgrp())
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		os.Exit(1)
	}
}
