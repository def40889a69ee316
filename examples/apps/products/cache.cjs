// A CommonJS module of the products app (see template.yaml).
exports.invalidate = (event) => {
  const product = event.new_image ?? event.old_image;
  console.log(`cache of product ${product.id} invalidated after ${event.event_name}`);
};
