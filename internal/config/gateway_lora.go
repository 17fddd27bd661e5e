package config

import "github.com/tlgw/tlgw/internal/oai"

// LoRAAdapter is one [[gateway.lora_adapters]] entry (R21): an adapter the gateway may ask a
// worker of BaseModel to load (vLLM's POST /v1/load_lora_adapter) when a request names it and
// no worker has it, with gateway.lora_load_on_demand = true.
type LoRAAdapter struct {
	Name      string `json:"name"`       // the model id clients send; 1 to 256 printable ASCII bytes, no spaces
	Path      string `json:"path"`       // the engine-side path passed as lora_path; 1 to 4096 bytes
	BaseModel string `json:"base_model"` // the workers' model that loads it
}

// MaxLoRAAdapterPath bounds an adapter's lora_path.
const MaxLoRAAdapterPath = 4096

// fileGatewayLoRA is the [gateway] keys of R21's LoRA adapters.
type fileGatewayLoRA struct {
	LoRALoadOnDemand *bool         `json:"lora_load_on_demand"`
	LoRAAdapters     []LoRAAdapter `json:"lora_adapters"`
}

func (fl *fileGatewayLoRA) apply(g *Gateway, base path, ps *problems) {
	setIf(&g.LoRALoadOnDemand, fl.LoRALoadOnDemand)
	seen := map[string]bool{} // bounded by the file's entries
	for i, a := range fl.LoRAAdapters {
		at := base.with(key("lora_adapters"), index(i))
		switch {
		case !oai.ValidName(a.Name):
			ps.add(at.with(key("name")), "must be 1 to 256 printable ASCII characters without spaces")
		case seen[a.Name]:
			ps.add(at.with(key("name")), "repeats adapter %q", a.Name)
		}
		seen[a.Name] = true
		if a.Path == "" || len(a.Path) > MaxLoRAAdapterPath {
			ps.add(at.with(key("path")), "must be 1 to %d bytes", MaxLoRAAdapterPath)
		}
		if !oai.ValidName(a.BaseModel) {
			ps.add(at.with(key("base_model")), "must be 1 to 256 printable ASCII characters without spaces")
		}
		if a.Name == a.BaseModel {
			ps.add(at.with(key("name")), "names its own base model")
		}
	}
	if len(fl.LoRAAdapters) > 0 {
		g.LoRAAdapters = append([]LoRAAdapter(nil), fl.LoRAAdapters...)
	}
}
