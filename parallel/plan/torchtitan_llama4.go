package plan

import (
	"fmt"
	"strings"
)

// Llama 4 in the torchtitan exports. torchtitan v0.2.2 (73a0e69,
// torchtitan/models/llama4/__init__.py) has the flavors 17bx16e_irope and
// 17bx128e_irope: the shapes of Scout and Maverick with NoPE layers every
// fourth layer and 8192-token chunks on the others (every_n_layers_nope 4,
// fixed_attn_block_size 8192, flex attention), which is what the exports
// name. Its model differs from Hugging Face's in what moves no FLOP or
// tensor moescope counts except where said: the NoPE layers are those with
// layer_id % 4 == 0 (Hugging Face's (i+1) % 4 == 0: the same count), no
// L2 QK-norm and no temperature tuning (elementwise ops), and attn_mask_type
// block_causal masks across documents (moescope prices whole sequences).
// torchtitan main (b5bcd76) removed models/llama4: the Python export is
// refused by name.
var torchtitanLlama4 = map[string]bool{"llama-4-scout": true, "llama-4-maverick": true}

// torchtitanLlama4Note is the comment the TOML export writes under [model].
const torchtitanLlama4Note = "# torchtitan v0.2.2's Llama 4 (irope flavor) puts NoPE on layers 0, 4, 8, … (Hugging Face: 3, 7, …), has no L2 QK-norm\n" +
	"# or temperature tuning, and masks across documents (block_causal): moescope priced Hugging Face's model over whole sequences.\n"

// titanMainRefusal names why current torchtitan cannot run model m, or "".
func titanMainRefusal(m string) error {
	if !torchtitanLlama4[m] {
		return nil
	}
	return fmt.Errorf("export: %s: torchtitan %s has no Llama 4 (models/llama4 was removed after %s): export the %s TOML instead",
		m, TorchtitanPyCommit[:7], TorchtitanTOMLTag, TorchtitanTOMLTag)
}

// titanLlama4Note writes the TOML's note for a Llama 4 model.
func titanLlama4Note(b *strings.Builder, m string) {
	if torchtitanLlama4[m] {
		b.WriteString(torchtitanLlama4Note)
	}
}
