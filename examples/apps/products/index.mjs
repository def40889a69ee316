// Handlers of the products app, as an ES module (see template.yaml).
// Each export takes the event, already parsed from JSON. Resolving is
// success; a throw or a rejection fails the attempt. Return values are
// ignored.

export async function indexed(event) {
  const product = event.new_image;
  // Stands in for a call to a search index.
  await new Promise((resolve) => setTimeout(resolve, 10));
  console.log(`product ${product.id} indexed: ${JSON.stringify(product.name)}`);
}
