""" The attention explorer page, opened from file:// in headless Chromium

The page computes the positional kinds' probabilities itself from the models' parameters; these tests read them
through ``window.saExplorer`` and compare them with sa_vision's own layers, evaluated in float64.
"""
import base64
import copy
import json
import random
import re
import stat
from pathlib import Path

import pytest
import timm
import torch
from browser import chromium_driver, console_errors, open_page, page_probs, requested_urls, require_browser
from helpers import usual_file_mode

from sa_vision.layers import PositionalAttention
from sa_vision.research.analysis import UNIFORM_PEAK_RATIO, head_statistics
from sa_vision.research.explorer import (
    ExplorerModel,
    explorer_data,
    gallery_indices,
    write_explorer,
    write_explorer_page,
)
from sa_vision.train.data import create_image_dataset, dataset_info
from sa_vision.train.positional_epochs import (
    load_positional_trajectory,
    positional_params,
    save_positional_trajectory,
)

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(embed_dim=16, depth=2, mlp_hidden_dim=32, heads_per_layer=3, num_classes=10)
NUM_IMAGES = 6
TOLERANCE = 1e-5
UNIFORM_HEAD = (0, 1)  # (layer, head) of the quadratic model made uniform by the fixture


def _trained_looking(model: torch.nn.Module, generator: torch.Generator) -> torch.nn.Module:
    """Random positional parameters away from the init: spread-out centres, unequal (and anisotropic) precisions."""
    with torch.no_grad():
        for layer in (m for m in model.modules() if isinstance(m, PositionalAttention)):
            position = layer.position
            if layer.kind == 'quadratic':
                position.centers.normal_(0, 3, generator=generator)
                position.precision_factors.uniform_(0.3, 2.5, generator=generator)
            elif layer.kind == 'generalized':
                position.centers.normal_(0, 3, generator=generator)
                position.precision_factors.normal_(0, 1, generator=generator)
    return model.eval()


@pytest.fixture(scope='module')
def models():
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    quadratic = _trained_looking(timm.create_model('sa_quadratic_cifar', **SMALL), generator)
    initial = _trained_looking(copy.deepcopy(quadratic), generator)  # the "epoch-000" centres
    # one head ends uniform, of precision near 0 as some of the kept zoos' heads: its largest probability is 1.1-1.4
    # times 1 / 256 at the test's queries, so that a threshold of 1 or 1.2 instead of UNIFORM_PEAK_RATIO is caught
    with torch.no_grad():
        layer, head = UNIFORM_HEAD
        position = [m for m in quadratic.modules() if isinstance(m, PositionalAttention)][layer].position
        position.precision_factors[head] = 0.05
    epochs = {'epoch-000': positional_params(initial.state_dict()),
              'epoch-001': positional_params(quadratic.state_dict())}
    pruned = _trained_looking(timm.create_model('sa_gen_cifar', **{**SMALL, 'heads_per_layer': (3, 2)}), generator)
    return [
        ExplorerModel('quadratic', quadratic, 'digits', epochs),
        ExplorerModel('generalized, pruned', pruned, 'digits'),
        ExplorerModel('learned', timm.create_model('sa_learned_cifar', **SMALL).eval(), 'digits', trained=False),
        ExplorerModel('content', timm.create_model('sa_content_cifar', **SMALL).eval(), 'digits'),
    ]


@pytest.fixture(scope='module')
def page(models, tmp_path_factory):
    return write_explorer(models, tmp_path_factory.mktemp('explorer') / 'page.html', num_images=NUM_IMAGES)


@pytest.fixture(scope='module')
def driver(page):
    require_browser()
    driver = chromium_driver()
    try:
        open_page(driver, page)
        yield driver
    finally:
        driver.quit()


def _gallery(models):
    """The gallery's images as the model sees them (normalised), picked independently of the page's code."""
    info = dataset_info('digits')
    ds = create_image_dataset('digits', 'test', is_training=False)
    indices = gallery_indices(ds.targets.tolist(), NUM_IMAGES)
    return torch.stack([ds[i][0] for i in indices]), [int(ds.targets[i]) for i in indices], info


def _layer_inputs(model, images):
    """The float32 input of every attention layer (grid-major h x w x B x D), read with hooks of the test's own."""
    inputs = []
    hooks = [m.register_forward_pre_hook(lambda _, args: inputs.append(args[0].detach()))
             for m in model.modules() if isinstance(getattr(m, 'attn', None), PositionalAttention)]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    return inputs


def reference_probs(model, layer_index, head, row, col, image=0, images=None, params=None):
    """sa_vision's probabilities of one head and query in float64: ``PositionalAttention.position_probs``, or for
    the content kind ``content_probs`` of the layer's own input."""
    layers = [m for m in model.modules() if isinstance(m, PositionalAttention)]
    layer = copy.deepcopy(layers[layer_index]).double()
    if params:
        layer.position.centers.data.copy_(params['centers'])
        layer.position.precision_factors.data.copy_(params['precision_factors'])
    grid_w = 16
    with torch.no_grad():
        if layer.kind == 'content':
            x = _layer_inputs(model, images)[layer_index].double()
            probs = layer.content_probs(x)[image, head]
        else:
            probs = layer.position_probs(16, grid_w)[head]
    return probs[row * grid_w + col]


def _max_error(driver, models, triples_per_model=12):
    images, _, _ = _gallery(models)
    rng = random.Random(0)
    worst = 0.0
    for index, entry in enumerate(models):
        heads = [m.num_heads for m in entry.model.modules() if isinstance(m, PositionalAttention)]
        for _ in range(triples_per_model):
            layer = rng.randrange(len(heads))
            head, row, col, image = rng.randrange(heads[layer]), rng.randrange(16), rng.randrange(16), \
                rng.randrange(NUM_IMAGES)
            got = torch.tensor(page_probs(driver, index, layer, head, row, col, image), dtype=torch.float64)
            want = reference_probs(entry.model, layer, head, row, col, image, images)
            worst = max(worst, float((got - want).abs().max()))
    return worst


def test_page_is_self_contained_and_error_free(driver, page):
    urls = requested_urls(driver, page)
    assert f'file://{page}' in urls and all(u.startswith(('file://', 'data:')) for u in urls), urls
    assert not console_errors(driver)
    html = page.read_text()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html), 'the page links to something outside itself'
    driver.execute_script('saExplorer.setModel(3); saExplorer.setImage(2); saExplorer.setModel(0)')
    assert not console_errors(driver)
    assert not [u for u in requested_urls(driver, page) if not u.startswith(('file://', 'data:'))]


def test_probabilities_are_the_models_own(driver, models):
    """Random (layer, head, query, image) of every kind against sa_vision's layers in float64."""
    assert _max_error(driver, models) < TOLERANCE


def test_epoch_slider_moves_to_the_kept_epoch(driver, models):
    epochs = models[0].epochs
    driver.execute_script('saExplorer.setModel(0); saExplorer.setEpoch(0)')
    assert driver.execute_script('return saExplorer.state().epoch') == 0
    for layer, head, row, col in ((0, 1, 3, 12), (1, 2, 9, 4)):
        params = {k.rsplit('.', 1)[-1]: v for k, v in epochs['epoch-000'].items() if k.startswith(f'blocks.{layer}.')}
        got = torch.tensor(page_probs(driver, 0, layer, head, row, col, 0, 0), dtype=torch.float64)
        want = reference_probs(models[0].model, layer, head, row, col, params=params)
        assert (got - want).abs().max() < TOLERANCE
        final = reference_probs(models[0].model, layer, head, row, col)
        assert (got - final).abs().max() > 1e-3  # the initial centres are elsewhere
    from selenium.webdriver.common.by import By
    slider = driver.find_element(By.ID, 'epoch')  # a screen reader hears the epoch's name, not the index
    assert (slider.get_attribute('value'), slider.get_attribute('aria-valuetext')) == ('0', 'epoch-000')
    driver.execute_script('saExplorer.setEpoch(1)')
    assert slider.get_attribute('aria-valuetext') == 'epoch-001'
    driver.execute_script('saExplorer.setModel(0)')
    assert (slider.get_attribute('value'), slider.get_attribute('aria-valuetext')) == ('2', 'final weights')


def test_a_click_shows_that_querys_maps(driver, models):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    driver.find_elements(By.CSS_SELECTOR, '#models button')[1].click()  # the pruned generalized model
    canvas = driver.find_element(By.ID, 'imageCanvas')
    row, col = 3, 11
    driver.execute_script('saExplorer.setQuery(12, 2)')
    # a click alone, with no pointer move before it: hovering sets the query too and would hide a broken click
    driver.execute_script(
        'const c = arguments[0], r = c.getBoundingClientRect(), [row, col] = arguments[1];'
        'c.dispatchEvent(new MouseEvent("click", {bubbles: true, clientX: r.left + (col + 0.5) * r.width / 16,'
        '                                          clientY: r.top + (row + 0.5) * r.height / 16}));',
        canvas, [row, col])
    rendered = driver.execute_script('return saExplorer.rendered()')
    assert rendered['model'] == 1 and rendered['query'] == [row, col]
    assert [len(layer) for layer in rendered['maps']] == [3, 2]  # the pruned model's heads
    assert len(driver.find_elements(By.CSS_SELECTOR, '#maps canvas')) == 5
    for layer, head in ((0, 0), (1, 1)):
        want = reference_probs(models[1].model, layer, head, row, col)
        assert (torch.tensor(rendered['maps'][layer][head], dtype=torch.float64) - want).abs().max() < TOLERANCE
    ActionChains(driver).send_keys(Keys.ARROW_LEFT).send_keys(Keys.ARROW_UP).perform()
    assert driver.execute_script('return saExplorer.rendered().query') == [row - 1, col - 1]


def _pointer(driver, kind: str, row: float, col: float) -> None:
    """A mouse event of ``kind`` at grid cell (row, col) of the image (outside it for a row or column out of the
    grid), dispatched as the browser would."""
    driver.execute_script(
        'const c = document.getElementById("imageCanvas"), r = c.getBoundingClientRect(), [kind, row, col] = arguments;'
        'c.dispatchEvent(new MouseEvent(kind, {bubbles: true, clientX: r.left + (col + 0.5) * r.width / 16,'
        '                                      clientY: r.top + (row + 0.5) * r.height / 16}));', kind, row, col)


def test_a_click_pins_the_query_until_a_click_on_it(driver):
    """Pointing moves the query; a click pins it where it points (pinned or not: after the arrow keys too), so that
    the pointer can go to the maps; a click on the pinned token lets go."""
    driver.execute_script('saExplorer.setModel(0); saExplorer.setPinned(false); saExplorer.setQuery(8, 8)')
    _pointer(driver, 'mousemove', 2, 3)
    assert driver.execute_script('return saExplorer.rendered().query') == [2, 3]
    _pointer(driver, 'click', 4, 5)
    _pointer(driver, 'mousemove', 15, 5)  # on the way down to the maps
    assert driver.execute_script('return saExplorer.rendered().query') == [4, 5]
    assert driver.find_element('id', 'queryText').text.endswith(', pinned')
    _pointer(driver, 'click', 6, 7)  # pinned elsewhere: the pin moves there
    _pointer(driver, 'mousemove', 9, 1)
    assert driver.execute_script('return saExplorer.state()')['query'] == [6, 7]
    _pointer(driver, 'click', 6, 7)  # on the pinned token: let go
    _pointer(driver, 'mousemove', 9, 1)
    assert driver.execute_script('return saExplorer.rendered().query') == [9, 1]
    assert not driver.execute_script('return saExplorer.state().pinned')


def test_arrow_keys_move_the_query_only_from_the_image(driver):
    """The image's arrow keys move (and pin) the query; the epoch slider's arrow keys move the slider alone."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    driver.execute_script('saExplorer.setModel(0); saExplorer.setPinned(false); saExplorer.setQuery(8, 8)')
    slider = driver.find_element(By.ID, 'epoch')
    assert slider.get_attribute('value') == slider.get_attribute('max') == '2'  # two kept epochs, then the final
    slider.send_keys(Keys.ARROW_LEFT)
    assert driver.execute_script('return saExplorer.state()')['epoch'] == 1
    assert driver.execute_script('return saExplorer.rendered().query') == [8, 8]
    driver.find_element(By.ID, 'imageCanvas').send_keys(Keys.ARROW_LEFT)
    state = driver.execute_script('return saExplorer.state()')
    assert state['query'] == [8, 7] and state['pinned'] and state['epoch'] == 1
    driver.execute_script('saExplorer.setModel(0)')


def test_a_scale_per_head_brings_out_the_spread_heads(driver, models):
    """On the shared scale only the heads holding the query's largest probability reach the scale's top colour; with
    a scale per head (the checkbox) every head's brightest cell does, the spread-out ones included."""
    from selenium.webdriver.common.by import By
    top = 'const [r, g, b] = [253, 231, 37];'  # viridis' last colour, the scale's top
    reaching_top = (top + 'return [...document.querySelectorAll("#maps canvas")].map(c => {'
                    '  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;'
                    '  for (let k = 0; k < d.length; k += 4) {'
                    '    if (d[k] === r && d[k + 1] === g && d[k + 2] === b) return 1;'
                    '  }'
                    '  return 0; });')
    driver.execute_script('saExplorer.setModel(0); saExplorer.setPerHead(false); saExplorer.setQuery(8, 8)')
    shared = driver.execute_script(reaching_top)
    assert 0 < sum(shared) < len(shared), shared  # the test's heads are spread unequally
    driver.find_element(By.ID, 'perHead').click()
    assert driver.execute_script('return saExplorer.state().perHead')
    assert driver.execute_script(reaching_top) == [1] * len(shared)
    assert 'scale of its own' in driver.find_element(By.ID, 'scaleHint').text
    # each head's top is named under its map: its largest probability, as sa_vision's layers give it
    captions = [c.text for c in driver.find_elements(By.CSS_SELECTOR, '#maps .head div')]
    heads = [(layer, head) for layer in range(2) for head in range(3)]
    assert [c.split(' · ')[0] for c in captions] == [f'head {h + 1}' for _, h in heads]
    for caption, (layer, head) in zip(captions, heads):
        largest = float(reference_probs(models[0].model, layer, head, 8, 8).max())
        assert float(caption.split(' · ')[1]) == pytest.approx(largest, rel=0.05), (caption, largest)
    driver.execute_script('saExplorer.setPerHead(false)')


def _uniform_captions(driver):
    from selenium.webdriver.common.by import By
    captions = [c.text for c in driver.find_elements(By.CSS_SELECTOR, '#maps .head div')]
    heads = SMALL['heads_per_layer']
    return [(i // heads, i % heads) for i, c in enumerate(captions) if c.endswith(' · uniform')]


def test_a_uniform_head_is_named_under_its_map(driver, models):
    """'uniform' under a map where the query's largest probability is at most UNIFORM_PEAK_RATIO / 256, by
    sa_vision's layers in float64 and by head_statistics; the kept epoch 0 has no such head."""
    heads = [(layer, head) for layer in range(2) for head in range(3)]
    for per_head in ('false', 'true'):
        for row, col in ((8, 8), (0, 15)):
            driver.execute_script(f'saExplorer.setModel(0); saExplorer.setPerHead({per_head}); '
                                  f'saExplorer.setQuery({row}, {col})')
            want = [(layer, head) for layer, head in heads
                    if float(reference_probs(models[0].model, layer, head, row, col).max()) * 256 <= UNIFORM_PEAK_RATIO]
            assert _uniform_captions(driver) == want == [UNIFORM_HEAD], (row, col)
    statistics = head_statistics(models[0].model, grid_size=(16, 16), query=(8, 8))
    assert [(r['layer'] - 1, r['head'] - 1) for r in statistics if r['uniform']] == [UNIFORM_HEAD]
    try:
        driver.execute_script('saExplorer.setEpoch(0)')
        assert _uniform_captions(driver) == []
    finally:
        driver.execute_script('saExplorer.setEpoch(1); saExplorer.setPerHead(false); saExplorer.setQuery(8, 8)')


def test_a_thumbnail_is_chosen_from_the_keyboard(driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    driver.execute_script('saExplorer.setModel(0); saExplorer.setImage(0)')
    thumb = driver.find_elements(By.CSS_SELECTOR, '.thumb')[2]
    assert thumb.get_attribute('tabindex') == '0' and thumb.get_attribute('role') == 'button'
    thumb.send_keys(Keys.ENTER)
    assert driver.execute_script('return saExplorer.state().image') == 2
    assert [t.get_attribute('aria-pressed') for t in driver.find_elements(By.CSS_SELECTOR, '.thumb')][:3] == \
        ['false', 'false', 'true']


def test_the_committed_page_is_the_template_of_today():
    """docs/explorer/index.html (the README's explorer) is rewritten with the template whenever it changes
    (docs/reproduction.md, "The attention explorer", has the command): all but its data is the template."""
    from importlib import resources
    template = resources.files('sa_vision.research').joinpath('explorer.html').read_text(encoding='utf-8')
    committed = (ROOT / 'docs' / 'explorer' / 'index.html').read_text(encoding='utf-8')
    shell = re.sub(r'(<script id="sa-data" type="application/json">).*?(</script>)', r'\1/*SA_EXPLORER_DATA*/null\2',
                   committed, count=1, flags=re.S)
    assert shell == template, 'rewrite docs/explorer/index.html with the command of docs/reproduction.md'


def test_the_maps_sit_beside_the_image_and_a_narrow_window_keeps_its_width(driver, page):
    """The committed page on a 1280x800 screen: its widest maps (9 heads) are beside the image, so that pointing at
    it one sees them (no line of text widens the image's panel). In a window narrower than the maps (a phone's),
    the page does not scroll sideways, the panels do."""
    from selenium.webdriver.common.by import By
    size = driver.get_window_size()
    try:
        driver.set_window_size(1280, 800)
        open_page(driver, ROOT / 'docs' / 'explorer' / 'index.html')
        left, maps = (driver.find_element(By.ID, i).rect for i in ('left', 'mapsPanel'))
        assert maps['y'] == left['y'] and maps['x'] > left['x'] + left['width'], (left, maps)
        driver.set_window_size(280, 800)
        inner, maps_width = driver.execute_script(
            'return [window.innerWidth, document.getElementById("maps").scrollWidth]')
        assert maps_width > inner  # the maps are wider than the window
        assert driver.execute_script('return document.documentElement.scrollWidth <= window.innerWidth')
    finally:
        driver.set_window_size(size['width'], size['height'])
        open_page(driver, page)


def test_the_centres_figure_holds_far_centres_and_a_title_cannot_break_the_page(driver, page, tmp_path):
    """A centre 11.5 tokens away widens the figure to hold it, to 12 (it was cut at 8 without a word); one beyond
    the farthest shift of the grid (15) is named in the caption. The title is the user's text, '<!--<script>' too,
    and so are the class names (a Hub folder's label names), shown as text."""
    from selenium.webdriver.common.by import By
    far, beyond = (timm.create_model('sa_quadratic_cifar', **SMALL).eval() for _ in range(2))
    with torch.no_grad():
        for model in (far, beyond):
            model.blocks[0].attn.position.centers[0] = torch.tensor([11.5, -3.0])
        beyond.blocks[1].attn.position.centers[1] = torch.tensor([0.0, 20.0])
    title = 'zoo <!--<script> </script> "test"'
    data = explorer_data([ExplorerModel('far', far, 'digits'), ExplorerModel('beyond', beyond, 'digits')],
                         num_images=2, title=title)
    data['dataset']['classes'] = [f'<i>{name}</i>' for name in data['dataset']['classes']]
    data['models'][1]['trained_on'] = '<i>elsewhere</i>'  # a checkpoint's own dataset name
    path = write_explorer_page(data, tmp_path / 'far.html')
    open_page(driver, path, timeout=120)  # a title that broke the page would leave it never ready
    try:
        assert driver.title == title
        assert driver.find_element(By.ID, 'prediction').text.startswith('true class: <i>')
        assert not driver.find_elements(By.CSS_SELECTOR, '#prediction i, #gallery i')  # no markup made of them
        for index, captions, extent in ((0, ['Layer 1 (3 heads)', 'Layer 2 (3 heads)'], 12),
                                        (1, ['Layer 1 (3 heads)', 'Layer 2 (3 heads; head 2 beyond the figure)'], 15)):
            driver.execute_script(f'saExplorer.setModel({index})')
            assert [f.text for f in driver.find_elements(By.CSS_SELECTOR, '#centers figcaption')] == captions
            assert f'+-{extent} tokens shown' in driver.find_element(By.ID, 'centersHint').text
        assert 'trained on <i>elsewhere</i>' in driver.find_element(By.ID, 'prediction').text
        assert not driver.find_elements(By.CSS_SELECTOR, '#prediction i, #gallery i')
    finally:
        open_page(driver, page)


def test_content_maps_follow_the_image(driver, models):
    images, _, _ = _gallery(models)
    maps = []
    for image in (0, 4):
        driver.execute_script(f'saExplorer.setModel(3); saExplorer.setImage({image}); saExplorer.setQuery(7, 7)')
        rendered = driver.execute_script('return saExplorer.rendered()')
        got = torch.tensor(rendered['maps'][1][2], dtype=torch.float64)
        assert (got - reference_probs(models[3].model, 1, 2, 7, 7, image, images)).abs().max() < TOLERANCE
        maps.append(got)
    assert (maps[0] - maps[1]).abs().max() > 1e-4


def test_gallery_shows_the_models_predictions(driver, models):
    from selenium.webdriver.common.by import By
    images, labels, info = _gallery(models)
    for index, entry in enumerate(models):
        driver.execute_script(f'saExplorer.setModel({index})')
        with torch.no_grad():
            predicted = entry.model(images).argmax(-1).tolist()
        thumbs = driver.find_elements(By.CSS_SELECTOR, '.thumb')
        assert len(thumbs) == NUM_IMAGES
        for k, (thumb, label, pred) in enumerate(zip(thumbs, labels, predicted)):
            # right or wrong in words too, not by colour alone
            verdict = ('right' if pred == label else 'wrong') if entry.trained else 'untrained (random weights)'
            mark = {'right': ' ✓ right', 'wrong': ' ✗ wrong'}.get(verdict, f' – {verdict}')
            lines = thumb.text.splitlines()
            assert lines[0] == f'true: {info.class_names[label]}'
            assert lines[1] == f'pred: {info.class_names[pred]}{mark}'
            assert thumb.get_attribute('aria-label') == (f'image {k + 1}: {info.class_names[label]}, predicted '
                                                         f'{info.class_names[pred]}, {verdict}')
            assert ('untrained' in thumb.find_element(By.CSS_SELECTOR, 'div:nth-of-type(2)').get_attribute('class')
                    ) == (not entry.trained)
        header = driver.find_element(By.ID, 'info').text
        assert header.startswith('UNTRAINED') == (not entry.trained), header
        assert ('untrained' in driver.find_element(By.ID, 'prediction').text) == (not entry.trained)


def test_a_model_of_other_data_names_its_own_classes_and_is_not_scored(driver, page, models, tmp_path):
    """A Fashion-MNIST model shown on the digits (--dataset digits): its top classes are Fashion-MNIST's, named so
    and marked as of other data, not coloured right or wrong against the digits' labels."""
    from selenium.webdriver.common.by import By
    fashion = dataset_info('fashion-mnist').class_names
    images, _, _ = _gallery(models)
    other = write_explorer([models[0], ExplorerModel('fashion', models[1].model, 'fashion-mnist')],
                           tmp_path / 'other.html', dataset='digits', num_images=NUM_IMAGES)
    with torch.no_grad():
        predicted = models[1].model(images).argmax(-1).tolist()
    open_page(driver, other)
    try:
        driver.execute_script('saExplorer.setModel(1)')
        for thumb, pred in zip(driver.find_elements(By.CSS_SELECTOR, '.thumb'), predicted):
            line = thumb.find_element(By.CSS_SELECTOR, 'div:nth-of-type(2)')
            assert line.text == f'pred: {fashion[pred]} – trained on fashion-mnist'
            assert thumb.get_attribute('aria-label').endswith(f', predicted {fashion[pred]}, trained on fashion-mnist')
            assert 'untrained' in line.get_attribute('class')  # the neutral colour, not ok / wrong
        assert driver.find_element(By.ID, 'info').text.startswith('TRAINED ON FASHION-MNIST - ')
        driver.execute_script('saExplorer.setModel(0)')  # the digits' own model keeps the digits' names
        assert not driver.find_element(By.ID, 'info').text.startswith('TRAINED ON')
    finally:
        open_page(driver, page)


def test_screenshot_holds_distinct_heat_maps(driver, tmp_path):
    import io

    import numpy as np
    from PIL import Image
    from selenium.webdriver.common.by import By
    driver.execute_script('saExplorer.setModel(0); saExplorer.setQuery(8, 8)')
    driver.save_screenshot(str(tmp_path / 'page.png'))
    heads = [np.asarray(Image.open(io.BytesIO(c.screenshot_as_png)).convert('L'), dtype=np.float64)
             for c in driver.find_elements(By.CSS_SELECTOR, '#maps canvas')]
    assert len(heads) == 6
    # the uniform head is nearly blank on the shared scale: that is why the page names it
    del heads[UNIFORM_HEAD[0] * SMALL['heads_per_layer'] + UNIFORM_HEAD[1]]
    assert all(h.std() > 10 for h in heads), 'a blank heat map'
    differences = [np.abs(a - b).mean() for i, a in enumerate(heads) for b in heads[i + 1:]]
    assert min(differences) > 2, 'two heads drawn alike'


def test_a_broken_formula_is_caught(driver, page, models, tmp_path):
    """The comparison can fail: the page with the quadratic kind's precision dropped disagrees."""
    html = page.read_text()
    broken = html.replace('const s2 = factors[h] * factors[h];', 'const s2 = 1;')
    assert broken != html
    (tmp_path / 'broken.html').write_text(broken)
    open_page(driver, tmp_path / 'broken.html')
    try:
        assert _max_error(driver, models[:1], triples_per_model=4) > 1e-3
    finally:
        open_page(driver, page)


def test_positional_trajectory_round_trip(models, tmp_path):
    path = save_positional_trajectory(models[0].epochs, tmp_path / 'epochs.safetensors')
    loaded = load_positional_trajectory(path)
    assert list(loaded) == list(models[0].epochs)
    for label, params in models[0].epochs.items():
        assert set(loaded[label]) == set(params) and all(torch.equal(loaded[label][k], v) for k, v in params.items())
    assert path.stat().st_size < 4096  # centres and precision factors only
    assert stat.S_IMODE(path.stat().st_mode) == usual_file_mode()  # safetensors' own writer leaves 0600


@pytest.mark.parametrize('epochs, match', [
    ('[oops', 'cannot be read'), ('{"a": 1}', 'must be a list of names'), ('["x", "x", "y"]', 'an epoch twice'),
    ('["a"]', 'stacks 2 epochs, its metadata names 1'), (None, 'cannot be read'),
])
def test_a_broken_file_of_epochs_is_one_error_that_names_it(models, tmp_path, epochs, match):
    """The epochs file comes with a folder or a Hub repository: metadata that do not name each stacked epoch once
    (or no safetensors at all) is an error naming the file, not a traceback or a page of fewer epochs."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from sa_vision.train.checkpoint import CheckpointError
    path = save_positional_trajectory(models[0].epochs, tmp_path / 'epochs.safetensors')  # two epochs
    if epochs is None:
        path.write_bytes(path.read_bytes()[:40])
    else:
        with safe_open(str(path), 'pt') as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        save_file(tensors, str(path), metadata={'epochs': epochs})
    with pytest.raises(CheckpointError, match=match) as info:
        load_positional_trajectory(path)
    assert str(path) in str(info.value)


def test_page_data_is_embedded_once(page):
    html = page.read_text()
    data = json.loads(re.search(r'<script id="sa-data" type="application/json">(.*?)</script>', html, re.S)
                      .group(1))
    assert [m['heads'] for m in data['models']] == [[3, 3], [3, 2], [3, 3], [3, 3]]
    assert data['images']['count'] == NUM_IMAGES and len(set(data['images']['labels'])) == NUM_IMAGES


def _digits_run(run, arch: str, model):
    """A run folder of ``model`` (of ``arch``, SMALL) as sa-vision-train leaves it after one epoch on digits."""
    from sa_vision.train.checkpoint import CHECKPOINT_VERSION
    run.mkdir()
    torch.save({'version': CHECKPOINT_VERSION, 'arch': arch, 'model_args': SMALL, 'state_dict': model.state_dict(),
                'epoch': 0, 'num_epochs': 1, 'dataset': 'digits'}, run / 'last.pth.tar')
    return run


def test_a_run_folder_brings_its_dataset_and_epochs(models, tmp_path, capsys):
    """sa-vision-explore takes a run folder of sa-vision-train: its checkpoint, its dataset and the weights it saved
    after every epoch (only the centres and precision factors go into the page)."""
    from safetensors.torch import save_file

    from sa_vision.cli import explore
    model = models[0].model
    run = _digits_run(tmp_path / 'run', 'sa_quadratic_cifar', model)
    for label, params in models[0].epochs.items():
        save_file({**model.state_dict(), **params}, str(run / f'{label}.safetensors'),
                  metadata={'arch': 'sa_quadratic_cifar', 'model_args': json.dumps(SMALL)})
    assert explore.main([str(run), '--images', '3', '--out', str(tmp_path / 'page.html')]) == 0
    data = _page_data(tmp_path / 'page.html')
    assert data['dataset']['name'] == 'digits' and data['images']['count'] == 3
    assert [e['label'] for e in data['models'][0]['epochs']] == ['epoch-000', 'epoch-001']
    assert data['models'][0]['trained'] is True

    # --no-pretrained: the run's architecture at random, shown on its dataset, as untrained and without epochs
    from sa_vision.research.explorer import resolve_explorer_model
    random_init = resolve_explorer_model(str(run), pretrained=False)
    assert random_init.dataset == 'digits' and not random_init.trained and not random_init.epochs
    assert not torch.equal(random_init.model.state_dict()['blocks.0.attn.position.centers'],
                           model.state_dict()['blocks.0.attn.position.centers'])
    capsys.readouterr()
    assert explore.main([str(run), '--no-pretrained', '--images', '500', '--out', str(tmp_path / 'random.html')]) == 0
    data = _page_data(tmp_path / 'random.html')
    assert data['models'][0]['trained'] is False and data['images']['count'] == 360  # the whole digits test split
    assert 'has 360 images: the gallery shows them all' in capsys.readouterr().out


def test_a_run_on_an_image_folder_is_shown_on_its_folder_with_its_class_names(tmp_path, caplog, capsys):
    """A run of --dataset '' reads its folder again (the run's --data-dir, as sa-vision-validate does) and names
    the gallery's classes by the run's label names, the folders' names in timm's order; each image's label is
    the class folder it lies in, also where the validation split lacks a class (c2)."""
    from helpers import train_here
    from PIL import Image

    from sa_vision.cli import explore
    names = ('c1', 'c10', 'c2')  # timm's order: c1, c2, c10
    for split in ('train', 'validation'):
        for k, name in enumerate(names):
            if split == 'validation' and name == 'c2':
                continue
            (tmp_path / 'data' / split / name).mkdir(parents=True)
            for i in range(2):
                Image.new('RGB', (8, 8), (90 * k, 30 * i, 60)).save(tmp_path / 'data' / split / name / f'{i}.png')
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', tmp_path / 'data',
                             '--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32',
                             '--epochs', 1, '-b', 3, '--workers', 0, '--output', tmp_path / 'out',
                             '--experiment', 'run')
    assert status == 0, log[-2000:]
    assert explore.main([str(tmp_path / 'out' / 'run'), '--images', '4', '--out', str(tmp_path / 'page.html')]) == 0
    data = _page_data(tmp_path / 'page.html')
    assert data['dataset']['classes'] == ['c1', 'c2', 'c10']
    files = sorted((tmp_path / 'data' / 'validation').rglob('*.png'), key=lambda f: (f.parent.name, f.name))
    shown = [data['dataset']['classes'][label] for label in data['images']['labels']]
    assert sorted(shown) == sorted(f.parent.name for f in files)
    pixels = torch.tensor(list(base64.b64decode(data['images']['pixels'])), dtype=torch.uint8).view(4, 3, 32, 32)
    for image, name in zip(pixels, shown):  # each image's colour is its folder's
        k = names.index(name)
        assert image[0, 16, 16] == 90 * k and image[2, 16, 16] == 60, (name, image[:, 16, 16])


def _page_data(path):
    """The data embedded in an explorer page."""
    html = path.read_text()
    return json.loads(re.search(r'type="application/json">(.*?)</script>', html, re.S).group(1))


def test_a_random_model_is_marked_untrained(tmp_path):
    """The README's command (--no-pretrained) builds random weights: the page is told so."""
    from sa_vision.cli import explore
    out = tmp_path / 'page.html'
    assert explore.main(['sa_quadratic_cifar', '--no-pretrained',
                         '--dataset', 'digits', '--images', '2', '--out', str(out)]) == 0
    assert _page_data(out)['models'][0]['trained'] is False


def test_models_of_different_datasets_need_a_dataset(models, tmp_path):
    from sa_vision.errors import UserError
    mixed = [models[0], ExplorerModel('other', models[2].model, 'fashion-mnist')]
    with pytest.raises(UserError, match='different datasets'):
        write_explorer(mixed, tmp_path / 'page.html')
    # a Hub folder's model.safetensors alone names no dataset: its folder does
    with pytest.raises(UserError, match=r"bare weights name none \(a Hub folder's config.json does: pass "
                                        r'local-dir:<folder>, not its model.safetensors\); pass --dataset'):
        write_explorer([ExplorerModel('bare', models[0].model)], tmp_path / 'page.html')


def test_an_hf_hub_models_epochs_come_from_the_cache_or_one_bounded_request(tmp_path, monkeypatch):
    """The optional epochs file of an ``hf-hub:`` model: from the cache, of the revision the name gives; none where
    the cache knows it missing, or where the Hub does not answer at once (the explorer waited through
    huggingface_hub's retries, for ever on a connection that hangs); a name with ``@revision`` was passed whole to
    hf_hub_download, an invalid repository id after the model had loaded."""
    import huggingface_hub
    from huggingface_hub import constants

    from sa_vision.research import explorer
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path))
    monkeypatch.setattr(explorer, 'load_positional_trajectory', lambda path: {'read': path})
    downloads = []
    monkeypatch.setattr(huggingface_hub, 'hf_hub_download',
                        lambda repo_id, filename, revision=None: downloads.append((repo_id, revision)) or 'got')
    name = explorer.POSITIONAL_EPOCHS_FILE
    for repo, folder in (('cached', 'snapshots'), ('missing', '.no_exist')):
        (tmp_path / f'models--me--{repo}' / folder / 'abc').mkdir(parents=True)
        (tmp_path / f'models--me--{repo}' / folder / 'abc' / name).write_bytes(b'')
        (tmp_path / f'models--me--{repo}' / 'refs').mkdir()
        (tmp_path / f'models--me--{repo}' / 'refs' / 'v1').write_text('abc')
    assert explorer.hub_epochs('me/cached@v1') == {
        'read': str(tmp_path / 'models--me--cached' / 'snapshots' / 'abc' / name)}
    assert explorer.hub_epochs('me/missing@v1') == {} and downloads == []
    monkeypatch.setattr(explorer, 'hub_unreachable', lambda repo, files: 'no answer')
    assert explorer.hub_epochs('me/other@main') == {} and downloads == []
    monkeypatch.setattr(explorer, 'hub_unreachable', lambda repo, files: None)
    assert explorer.hub_epochs('me/other@main') == {'read': 'got'} and downloads == [('me/other', 'main')]


def test_a_runs_data_dir_is_found_for_any_dataset_as_validate_finds_it(tmp_path, monkeypatch):
    """sa-vision-explore of a run trained on torch/cifar100 (any dataset read from --data-dir) said "needs
    --data-dir": only an image folder's was taken from the run, where sa-vision-validate takes any."""
    from sa_vision.research import explorer
    asked = []

    class Read(Exception):
        pass

    def create_image_dataset(name, split, is_training, data_dir=None, **kwargs):
        asked.append((name, data_dir))
        raise Read
    monkeypatch.setattr(explorer, 'create_image_dataset', create_image_dataset)
    (tmp_path / 'data').mkdir()
    model = explorer.ExplorerModel('run', timm.create_model('sa_quadratic_cifar', **SMALL), 'torch/cifar100', {},
                                   data_dir=str(tmp_path / 'data'))
    with pytest.raises(Read):
        explorer.explorer_data([model])
    assert asked == [('torch/cifar100', str(tmp_path / 'data'))]


def test_a_model_of_more_classes_than_its_datasets_labels_is_explored():
    """A model trained with --num-classes 12 on a 10-class dataset (as training and validation take it: more classes
    than labels are never targets) was refused as "trained on other data"; the page names the extra classes by
    number."""
    from sa_vision.errors import UserError
    from sa_vision.research import explorer
    model = explorer.ExplorerModel('twelve', timm.create_model('sa_quadratic_cifar', **{**SMALL, 'num_classes': 12}
                                                               ).eval(), 'digits', {})
    data = explorer.explorer_data([model], num_images=2)
    (record,) = data['models']
    assert len(record['predictions']) == 2 and 'trained_on' not in record
    with pytest.raises(UserError, match='has 8 classes but the images come from a dataset of 10'):
        explorer.explorer_data([explorer.ExplorerModel(
            'eight', timm.create_model('sa_quadratic_cifar', **{**SMALL, 'num_classes': 8}).eval(), 'digits', {})],
            num_images=2)


def test_exploring_a_model_leaves_it_as_it_was():
    """A notebook's model in training mode and bf16, holding a tensor of its graph (which no deepcopy copies): the
    page is drawn in eval mode and float32, and the model given is in training mode and bf16 again."""
    from sa_vision.research import explorer
    model = timm.create_model('sa_quadratic_cifar', **SMALL).to(torch.bfloat16).train()
    model.last_logits = model(torch.randn(1, 3, 8, 8, dtype=torch.bfloat16))
    explorer.explorer_data([explorer.ExplorerModel('mine', model, 'digits', {})], num_images=2)
    assert model.training and all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_the_gallery_is_of_the_size_the_model_takes(tmp_path):
    """A model trained with --img-size 16 (its cfg's input_size, which sa-vision-validate reads) is shown 16x16
    images, not 32x32 ones (which it scored far worse on); models of two sizes are not put on one page."""
    from sa_vision.errors import UserError
    torch.manual_seed(0)
    small = timm.create_model('sa_quadratic_cifar', **SMALL, pretrained_cfg_overlay=dict(input_size=(3, 16, 16)))
    data = explorer_data([ExplorerModel('small', small, 'digits')], num_images=2)
    assert (data['images']['height'], data['images']['width']) == (16, 16)
    usual = timm.create_model('sa_quadratic_cifar', **SMALL)
    with pytest.raises(UserError, match=r'the models take images of different sizes \(16, 32 px\)'):
        explorer_data([ExplorerModel('small', small, 'digits'), ExplorerModel('usual', usual, 'digits')])
    # a model that adds the dataset's border itself (28x28 Fashion-MNIST padded to 32x32) is shown the padded images
    # and runs on its 16x16 grid, beside a random model of the registered 32x32
    padded = timm.create_model('sa_quadratic_cifar', **SMALL, input_padding=2,
                               pretrained_cfg_overlay=dict(input_size=(3, 28, 28)))
    data = explorer_data([ExplorerModel('padded', padded, 'digits'), ExplorerModel('usual', usual, 'digits')],
                         num_images=2)
    assert (data['images']['height'], [m['grid'] for m in data['models']]) == (32, [[16, 16], [16, 16]])


def test_a_content_model_runs_once_over_the_gallery_whatever_its_size():
    """The content kind's page needs each image's layer inputs: they came from one forward of the whole gallery per
    image (24 images took 380 s); the passes are as many, each of the whole gallery, for 2 images as for 5."""
    model = timm.create_model('sa_content_cifar', **SMALL).eval()
    batches = []
    hook = model.register_forward_pre_hook(lambda _, args: batches.append(args[0].shape[0]))
    try:
        passes = {}
        for count in (2, 5):
            batches.clear()
            explorer_data([ExplorerModel('content', model, 'digits')], num_images=count)
            assert batches and set(batches) == {count}, batches
            passes[count] = len(batches)
    finally:
        hook.remove()
    assert passes[2] == passes[5], passes


def test_a_model_of_non_finite_outputs_is_refused_and_no_nan_reaches_a_page(tmp_path):
    """Diverged weights (a NaN bias): json.dumps wrote NaN, the page's JSON.parse failed and the page stayed blank
    while the command reported success. The model is refused by name, and no page is written."""
    from sa_vision.errors import UserError
    model = timm.create_model('sa_quadratic_cifar', **SMALL).eval()
    with torch.no_grad():
        model.get_classifier().bias[3] = float('nan')
    out = tmp_path / 'page.html'
    with pytest.raises(UserError, match=r'^diverged gives non-finite outputs \(NaN or inf\) .* its weights diverged'):
        write_explorer([ExplorerModel('diverged', model, 'digits')], out, num_images=2)
    assert not out.exists()
    with pytest.raises(ValueError):  # whatever else could carry a NaN: never written as the page's data
        write_explorer_page({'title': 'nan', 'uniform_peak_ratio': float('nan')}, out)
    assert not out.exists()


def _folder_model(names, seed=0):
    """A model as trained on an image folder of classes ``names`` (its cfg's label names, as a run records them)."""
    torch.manual_seed(seed)
    return timm.create_model('sa_quadratic_cifar', **{**SMALL, 'num_classes': len(names)},
                             pretrained_cfg_overlay=dict(label_names=list(names))).eval()


def test_a_model_of_an_unnamed_image_folder_is_not_scored_against_other_data(models):
    """A run of --dataset '' (the dataset '', which is false) shown with --dataset digits was scored against the
    digits' labels with no word of its folder, or with other than ten classes refused with "pass --dataset"."""
    from sa_vision.errors import UserError
    images, _, _ = _gallery(models)
    for names in (('cat', 'dog', 'emu'), tuple(f'class {c}' for c in range(10))):
        model = _folder_model(names)
        data = explorer_data([ExplorerModel('folder', model, '', {}, data_dir='/nowhere')], dataset='digits',
                             num_images=NUM_IMAGES)
        (record,) = data['models']
        assert record['trained_on'] == 'an image folder' and record['classes'] == list(names)
        with torch.no_grad():
            assert [p[0][0] for p in record['predictions']] == model(images).argmax(-1).tolist()
    # its architecture at random, of three classes, cannot be shown on the digits: the advice names its own data
    random_init = ExplorerModel('random', _folder_model(('cat', 'dog', 'emu')), '', trained=False)
    with pytest.raises(UserError, match=r"has 3 classes .* of 10; it is of an image folder: show it with "
                                        r"--dataset ''$"):
        explorer_data([random_init], dataset='digits', num_images=2)


def test_models_of_two_image_folders_are_not_shown_as_one(tmp_path):
    """Two runs of --dataset '' were one dataset to the page, whatever their folders and classes: the gallery was
    the first one's, labelled by its names, and the other model scored against them."""
    from PIL import Image

    from sa_vision.errors import UserError
    for split in ('train', 'validation'):
        for k, name in enumerate(('cat', 'dog')):
            (tmp_path / 'data' / split / name).mkdir(parents=True)
            Image.new('RGB', (8, 8), (90 * k, 0, 60)).save(tmp_path / 'data' / split / name / '0.png')
    here, elsewhere = str(tmp_path / 'data'), str(tmp_path / 'other')
    pets, birds = _folder_model(('cat', 'dog')), _folder_model(('owl', 'tit'))
    with pytest.raises(UserError, match=r'image folders of different classes \(cat, dog; owl, tit\): show them on '
                                        r'separate pages'):
        explorer_data([ExplorerModel('pets', pets, '', data_dir=here), ExplorerModel('birds', birds, '',
                                                                                     data_dir=here)])
    two_folders = [ExplorerModel('pets', pets, '', data_dir=here), ExplorerModel('more pets', pets, '',
                                                                                 data_dir=elsewhere)]
    with pytest.raises(UserError, match=rf'different image folders \({re.escape(here)}, {re.escape(elsewhere)}\)'):
        explorer_data(two_folders)
    # one folder of the same classes: one gallery; or the folder named with --data-dir
    for data in (explorer_data([two_folders[0], ExplorerModel('again', pets, '', data_dir=here)]),
                 explorer_data(two_folders, data_dir=here)):
        assert data['dataset']['classes'] == ['cat', 'dog'] and 'trained_on' not in data['models'][1]


def test_a_run_of_another_held_out_split_is_shown_on_that_split(tmp_path, caplog, capsys):
    """A run on an image folder of train/ and test/ (--val-split test) could not be explored: the page always read
    the dataset's default split, 'validation', which the folder has not. The run's own split is read, and
    --val-split names one for weights that record none. sa-vision-validate of the run reads that split too."""
    from helpers import command_here, train_here
    from PIL import Image

    from sa_vision.cli import explore
    for split, shade in (('train', 0), ('test', 200)):
        for k, name in enumerate(('a', 'b')):
            (tmp_path / 'data' / split / name).mkdir(parents=True)
            Image.new('RGB', (8, 8), (shade, 90 * k, 60)).save(tmp_path / 'data' / split / name / '0.png')
    status, log = train_here(caplog, capsys, '--dataset', '', '--data-dir', tmp_path / 'data', '--val-split', 'test',
                             '--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32',
                             '--epochs', 1, '-b', 2, '--workers', 0, '--output', tmp_path / 'out',
                             '--experiment', 'run')
    assert status == 0, log[-2000:]
    for command in ([str(tmp_path / 'out' / 'run')],
                    ['sa_quadratic_cifar', '--no-pretrained', '--dataset', '', '--data-dir', str(tmp_path / 'data'),
                     '--val-split', 'test']):
        assert explore.main([*command, '--images', '2', '--out', str(tmp_path / 'page.html')]) == 0
        data = _page_data(tmp_path / 'page.html')
        assert data['dataset']['split'] == 'test'
        pixels = torch.tensor(list(base64.b64decode(data['images']['pixels'])), dtype=torch.uint8).view(2, 3, 32, 32)
        assert pixels[:, 0, 16, 16].tolist() == [200, 200]  # the test split's images
    status, out, err = command_here(capsys, 'validate', '--checkpoint', tmp_path / 'out' / 'run' / 'last.pth.tar',
                                    '--threads', 1, '--workers', 0)
    assert status == 0 and json.loads(out.splitlines()[-1])['split'] == 'test', err[-2000:]
    assert "split test: the run's --val-split (--split chooses another)" in err


def test_the_epochs_of_a_run_of_over_999_epochs_are_in_their_order(models, tmp_path):
    """A run pads the epochs done to three digits: by name, epoch-1000 came before epoch-999 on the slider."""
    from safetensors.torch import save_file

    from sa_vision.train.positional_epochs import run_epochs
    model = models[0].model
    done = [0, 9, 10, 99, 100, 998, 999, 1000, 1001, 12345]
    for epoch in random.Random(0).sample(done, len(done)):  # written in no order
        save_file(model.state_dict(), str(tmp_path / f'epoch-{epoch:03d}.safetensors'),
                  metadata={'arch': 'sa_quadratic_cifar', 'model_args': json.dumps(SMALL)})
    assert list(run_epochs(tmp_path)) == [f'epoch-{epoch:03d}' for epoch in done]


def test_a_long_class_name_stays_inside_its_card(driver, page, models, tmp_path):
    """An image folder's class of no spaces (a long folder name) ran out of its thumbnail's card."""
    from selenium.webdriver.common.by import By
    names = ['a_folder_named_' + 'x' * 60 + str(c) for c in range(10)]
    other = write_explorer([ExplorerModel('folder', _folder_model(names), '')], tmp_path / 'long.html',
                           dataset='digits', num_images=NUM_IMAGES)
    open_page(driver, other)
    try:
        thumbs = driver.find_elements(By.CSS_SELECTOR, '.thumb')
        assert len(thumbs) == NUM_IMAGES and names[0][:20] in thumbs[0].text
        for thumb in thumbs:
            assert driver.execute_script('return arguments[0].scrollWidth <= arguments[0].clientWidth', thumb)
    finally:
        open_page(driver, page)


def test_a_big_content_page_is_warned_of_with_what_makes_it_big(models, tmp_path, capsys, monkeypatch):
    """The registered content model's page of 24 images is 171 MB (92 MB whatever the images): the command says so
    on stderr past PAGE_SIZE_WARNING, with the part that grows with --images and the part that does not."""
    from helpers import command_here

    from sa_vision.research import explorer
    content = models[3].model
    run = _digits_run(tmp_path / 'run', 'sa_content_cifar', content)
    argv = ['explore', run, '--images', 3, '--out', tmp_path / 'page.html']
    status, _, err = command_here(capsys, *argv)
    assert status == 0 and 'warning' not in err  # a page of a few hundred kB

    def base64_mb(floats):
        return 4 * -(-4 * floats // 3) / 1e6
    layers = [m for m in content.modules() if isinstance(m, PositionalAttention)]
    tokens = 3 * len(layers) * base64_mb(16 * 16 * SMALL['embed_dim'])  # each layer's 16 x 16 input, per image
    weights = sum(base64_mb(p.numel()) for layer in layers for linear in (layer.content.query, layer.content.key)
                  for p in (linear.weight, linear.bias))
    monkeypatch.setattr(explorer, 'PAGE_SIZE_WARNING', 1000)
    status, _, err = command_here(capsys, *argv)
    size = (tmp_path / 'page.html').stat().st_size
    assert status == 0 and err.strip() == (
        f'warning: the page is {size / 1e6:.3g} MB, which a browser opens slowly: the content kind ({run}) brings '
        f"every layer's input for each image ({tokens:.3g} MB for 3 images) and its query and key weights "
        f'({weights:.3g} MB whatever the images). Pass fewer --images, or explore a narrower model (a smaller '
        f'embed_dim)')


def test_each_model_on_an_image_folder_is_fed_its_own_normalisation(tmp_path):
    """On an image folder the normalisation is each model's own (its pretrained_cfg's, as sa-vision-validate feeds
    it): a model listed after another of other mean and std was fed the first one's, and its predictions changed
    with its place in the list."""
    from PIL import Image
    for k, name in enumerate(('a', 'b', 'c')):
        (tmp_path / 'validation' / name).mkdir(parents=True)
        for i in range(2):
            Image.new('RGB', (32, 32), (80 * k, 40 + 60 * i, 200 - 50 * k)).save(tmp_path / 'validation' / name /
                                                                              f'{i}.png')
    torch.manual_seed(0)
    models = [ExplorerModel(name, timm.create_model('sa_quadratic_cifar', **{**SMALL, 'num_classes': 3},
                                                    pretrained_cfg_overlay=dict(mean=mean, std=std)).eval(), '')
              for name, mean, std in (('cifar', (0.49, 0.48, 0.45), (0.2, 0.2, 0.2)), ('own', (0.1,) * 3, (0.9,) * 3))]
    for order in (models, models[::-1]):
        data = explorer_data(order, dataset='', data_dir=str(tmp_path), num_images=4)
        shape = [data['images'][k] for k in ('count', 'channels', 'height', 'width')]
        images = torch.tensor(list(base64.b64decode(data['images']['pixels'])), dtype=torch.float32).view(shape) / 255
        for entry, record in zip(order, data['models']):
            cfg = entry.model.pretrained_cfg
            mean, std = (torch.tensor(cfg[k])[:, None, None] for k in ('mean', 'std'))
            with torch.no_grad():
                probs = entry.model(((images.expand(-1, 3, -1, -1) - mean) / std)).softmax(-1)
            top = [[int(c), float(p)] for p, c in zip(*probs.max(-1))]
            assert [prediction[0][0] for prediction in record['predictions']] == [c for c, _ in top], entry.name
            assert [prediction[0][1] for prediction in record['predictions']] == pytest.approx(
                [p for _, p in top], abs=1e-5), entry.name


def test_the_epochs_of_a_runs_best_weights_end_at_their_epoch(models, tmp_path):
    """model_best.pth.tar of a run whose best epoch came before its last: the page's epoch slider and the
    trajectory figure end at the weights' own epoch (as an export of them keeps), not at the run's last."""
    from sa_vision.cli.plot_attention import _kept_epochs
    from sa_vision.research.explorer import resolve_explorer_model
    from sa_vision.train.positional_epochs import record_epoch_positions
    model = models[0].model
    run = _digits_run(tmp_path / 'run', 'sa_quadratic_cifar', model)
    last = torch.load(run / 'last.pth.tar', weights_only=True)
    torch.save({**last, 'epoch': 1, 'num_epochs': 2}, run / 'last.pth.tar')  # two epochs done, the best after one
    torch.save(last, run / 'model_best.pth.tar')
    for epochs_done in range(3):
        record_epoch_positions(model, run, epochs_done)
    assert list(resolve_explorer_model(str(run)).epochs) == ['epoch-000', 'epoch-001', 'epoch-002']
    assert list(resolve_explorer_model(str(run / 'model_best.pth.tar')).epochs) == ['epoch-000', 'epoch-001']
    assert _kept_epochs(str(run / 'model_best.pth.tar'), model)[1] == ['epoch-000', 'epoch-001']
    # the whole weights the run kept of an epoch (--save-epoch-weights): up to the epoch their name says
    from safetensors.torch import save_file
    save_file(model.state_dict(), str(run / 'epoch-001.safetensors'),
              metadata={'arch': 'sa_quadratic_cifar', 'model_args': json.dumps(SMALL)})
    assert list(resolve_explorer_model(str(run / 'epoch-001.safetensors')).epochs) == ['epoch-000', 'epoch-001']
    assert _kept_epochs(str(run / 'epoch-001.safetensors'), model)[1] == ['epoch-000', 'epoch-001']
