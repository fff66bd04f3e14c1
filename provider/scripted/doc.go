// Package scripted holds ScriptedProvider, the provider.Provider that
// answers without a model, steered by directives in the prompt's text: the
// demo's provider, the executor's default and the tests'.
package scripted
